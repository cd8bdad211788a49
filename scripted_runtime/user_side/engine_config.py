"""Engine arguments: per-device defaults and the named topologies.

The CPU default is the configuration measured in docs/sglang-facts.md,
"Running on CPU": a tiny Qwen2 whose weights are the context-sensitive
construction (``models/construction.py``, a safetensors checkpoint written
locally and loaded by SGLang's own loader), float32, torch-native attention,
no CUDA graphs, 8192 KV tokens, 64-token prefill chunks. The GPU default
serves Qwen2.5-0.5B's config with dummy weights.
"""
from __future__ import annotations

import ast
import json
import shlex
from typing import Any, Dict, List, Tuple

TOPOLOGIES: Dict[str, Dict[str, Any]] = {
    # SGLang's default loop on pp=1 (overlap scheduling stays on, CPU included)
    "pp1-overlap": {},
    "pp1-normal": {"disable_overlap_schedule": True},
    # PP disables overlap scheduling; pp_loop_size = pp_size + depth = 6
    "pp4": {"pp_size": 4, "pp_async_batch_depth": 2},
}

# Topologies with an engine feature on, for ``explore`` and ``mutate`` (the test suite's
# topology-parametrized tests run on TOPOLOGIES only).
FEATURE_TOPOLOGIES: Dict[str, Dict[str, Any]] = {
    # HiCache (write-through) on the normal loop with a small device pool: 400 KV tokens, a host pool
    # 1.2x that (481), so the explorer's prompts (3 prefixes of up to 192 tokens) are evicted to the
    # host, loaded back, and evict the host pool too.
    "pp1-hicache": {"disable_overlap_schedule": True, "enable_hierarchical_cache": True,
                    "hicache_write_policy": "write_through", "max_total_tokens": 400, "hicache_ratio": 1.2},
    # LoRA on the overlap loop: adapters loaded and unloaded at run time (ctx.load_lora_adapter), two
    # per batch, so a third adapter's requests wait for a slot (the admission's LoRA budget); the
    # torch backend is the one with a CPU path (hooks/cpu_enablement.py, item 6)
    "pp1-lora": {"enable_lora": True, "lora_backend": "torch_native", "max_lora_rank": 8,
                 "lora_target_modules": ["q_proj", "v_proj"], "max_loras_per_batch": 2},
    # Priority scheduling on the overlap loop (fcfs within a priority, preemption on, SGLang's threshold
    # 10): three running requests at most, so a fourth admission preempts (SGLang preempts only when
    # the running slots are full, never for KV alone: docs/checks.md, "The priority contract")
    "pp1-priority": {"enable_priority_scheduling": True, "max_running_requests": 3},
    # The overlap loop with a tokenizer (the harness's own for the tiny model,
    # user_side/models/tokenizer.py): stop strings, which SGLang refuses without one, and the
    # detokenizer's text
    "pp1-text": {"skip_tokenizer_init": False},
}
ALL_TOPOLOGIES: Dict[str, Dict[str, Any]] = {**TOPOLOGIES, **FEATURE_TOPOLOGIES}

DEVICE_MODELS = {"cpu": "tiny-qwen2", "cuda": "qwen2.5-0.5b"}

COMMON: Dict[str, Any] = {
    "skip_tokenizer_init": True,
    "max_total_tokens": 8192,
    "chunked_prefill_size": 64,
    "log_level": "warning",
}

DEVICE_DEFAULTS: Dict[str, Dict[str, Any]] = {
    "cpu": {
        "device": "cpu",
        "load_format": "safetensors",
        "dtype": "float32",
        "attention_backend": "torch_native",
        "sampling_backend": "pytorch",
        "disable_cuda_graph": True,
    },
    "cuda": {
        "device": "cuda",
        "load_format": "dummy",
        "dtype": "bfloat16",
        "mem_fraction_static": 0.5,
        "disable_cuda_graph": True,
    },
}


def engine_kwargs(device: str = "cpu", topology: str = "pp1-overlap", **overrides: Any) -> Dict[str, Any]:
    """Full engine kwargs for ``device`` and ``topology``; ``overrides`` win.
    ``model_path`` is left for the launcher to fill from ``DEVICE_MODELS``."""
    if device not in DEVICE_DEFAULTS:
        raise ValueError(f"device must be one of {sorted(DEVICE_DEFAULTS)}, got {device!r}")
    if topology not in ALL_TOPOLOGIES:
        raise ValueError(f"topology must be one of {sorted(ALL_TOPOLOGIES)}, got {topology!r}")
    chosen = {**ALL_TOPOLOGIES[topology], **overrides}
    kwargs = {**COMMON, **DEVICE_DEFAULTS[device], **chosen}
    if device == "cpu" and _truthy(kwargs.get("enable_hierarchical_cache")):
        kwargs.update(hicache_cpu_args(chosen))
    return kwargs


def features_of(topology: str, overrides: Dict[str, Any] = None) -> Tuple[str, ...]:
    """The engine features a topology (with ``overrides``) has on, as the
    explorer's windows and actions name them: "hicache", "lora", "priority",
    "text" (a tokenizer: stop strings)."""
    chosen = {**ALL_TOPOLOGIES.get(topology, {}), **(overrides or {})}
    return tuple(name for name, key in (("hicache", "enable_hierarchical_cache"), ("lora", "enable_lora"),
                                        ("priority", "enable_priority_scheduling"))
                 if _truthy(chosen.get(key))) + (("text",) if "skip_tokenizer_init" in chosen
                                                  and not _truthy(chosen["skip_tokenizer_init"]) else ())


def skips_tokenizer(kwargs: Dict[str, Any]) -> bool:
    """Whether engine ``kwargs`` start SGLang without a tokenizer (the
    default: prompts are token ids)."""
    return _truthy(kwargs.get("skip_tokenizer_init", True))


def run_options(topology: str) -> str:
    """The ``scripted-runtime run`` options that start ``topology``
    (" --no-overlap ..."; "" for the default)."""
    base = {"pp1-overlap": "", "pp1-normal": " --no-overlap", "pp4": " --pp 4"}
    if topology in base:
        return base[topology]
    args = dict(ALL_TOPOLOGIES[topology])
    opts = " --no-overlap" if args.pop("disable_overlap_schedule", False) else ""
    if args.get("pp_size"):
        opts += f" --pp {args.pop('pp_size')}"
        args.pop("pp_async_batch_depth", None)
    return opts + "".join(f" --sglang-arg {shlex.quote(f'{k}={_option_value(v)}')}" for k, v in args.items())


def _option_value(value: Any) -> str:
    """A ``--sglang-arg`` value that ``parse_engine_args`` reads back: a
    bool as true/false, a list as a literal without spaces."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(json.dumps(v) for v in value) + "]"
    return str(value)

# HiCache on CPU (hooks/hicache_cpu.py): only the direct copy of the layer-first layout has a CPU path.
HICACHE_CPU = {"hicache_io_backend": "direct", "hicache_mem_layout": "layer_first"}
# An explicit host pool size (twice the device pool): SGLang otherwise sizes it from the host's free
# memory after a 10 GiB reserve, which on a busy 24 GiB box leaves nothing ("No host memory is left
# for HiCache") and would make the pool, and so eviction, depend on what else runs.
HICACHE_CPU_DEFAULTS = {"hicache_ratio": 2}


def _truthy(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("true", "1", "yes", "on")


def hicache_cpu_args(overrides: Dict[str, Any]) -> Dict[str, Any]:
    """The HiCache arguments a CPU server needs; a ValueError (one line)
    for a combination that cannot run on CPU, naming what to use."""
    wrong = {k: overrides[k] for k in HICACHE_CPU if k in overrides and overrides[k] != HICACHE_CPU[k]}
    if wrong:
        given = ", ".join(f"{k}={v}" for k, v in wrong.items())
        want = " ".join(f"--sglang-arg {k}={v}" for k, v in HICACHE_CPU.items())
        raise ValueError(f"HiCache on CPU cannot use {given}: the kernel I/O backend and the page_first layouts "
                         f"need CUDA/HIP copy kernels; use {want} (the CPU default)")
    sized = "hicache_ratio" in overrides or "hicache_size" in overrides
    return {**HICACHE_CPU, **({} if sized else HICACHE_CPU_DEFAULTS)}


def base_topology(topology: str) -> str:
    """The plain topology a feature topology adds its feature to (the same
    loop and PP size): pp1-hicache -> pp1-normal, pp1-lora -> pp1-overlap;
    a plain topology is its own."""
    if topology in TOPOLOGIES or topology not in FEATURE_TOPOLOGIES:
        return topology
    args = FEATURE_TOPOLOGIES[topology]
    return topology_for(int(args.get("pp_size", 1) or 1), not _truthy(args.get("disable_overlap_schedule")))


def topology_for(pp: int, overlap: bool) -> str:
    if pp == 4:
        return "pp4"
    if pp == 1:
        return "pp1-overlap" if overlap else "pp1-normal"
    raise ValueError(f"--pp must be 1 or 4 (the measured topologies), got {pp}")


def parse_engine_args(pairs: List[str]) -> Dict[str, Any]:
    """['chunked_prefill_size=32', 'enable_x=true'] -> {...}; values are
    Python literals where they parse as one, else strings."""
    out: Dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ValueError(f"engine argument must be key=value, got {pair!r}")
        lowered = raw.strip().lower()
        if lowered in ("true", "false"):
            value: Any = lowered == "true"
        elif lowered in ("none", "null"):
            value = None
        else:
            try:
                value = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                value = raw
        out[key] = value
    return out
