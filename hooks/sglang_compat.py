"""Every SGLang-version difference the harness knows about, in one place.

Supporting a new SGLang release means editing this module (and its tests: the
version rules in tests/logic/test_sglang_compat.py and tests/logic/test_builds.py), not
grepping the tree. Each fact names the
releases it was read off. Where a feature test is possible it is preferred to
a version comparison, so that source trees between releases also work.
"""
from __future__ import annotations

import functools
import importlib.metadata
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

SCHEDULER_MODULE = "sglang.srt.managers.scheduler"
TOKENIZER_MANAGER_MODULE = "sglang.srt.managers.tokenizer_manager"
IO_STRUCT_MODULE = "sglang.srt.managers.io_struct"
# CUDA kernels package: <=0.5.12.post1 imports it unconditionally (stubbed on CPU).
SGL_KERNEL_MODULE = "sgl_kernel"
PYNCCL_MODULE = "sglang.srt.distributed.device_communicators.pynccl"
# 0.5.9+ : rotary_embedding is a package and the flag lives in .base;
# <=0.5.8.post1: rotary_embedding is a single module holding the flag.
ROTARY_CPU_FLAG_MODULES = (
    "sglang.srt.layers.rotary_embedding.base",
    "sglang.srt.layers.rotary_embedding",
)
# Environment the harness gives every server. 0.5.2x's default Rust radix tree
# core cannot be walked from Python (node_by_id / root_node raise
# NotImplementedError); the Python core can. Ignored by older releases.
SERVER_ENV = {"SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python"}
# What importing SGLang sets in the importing process's environment, where it is not set
# (0.5.23, measured: ``import sglang.srt.managers.scheduler``): cache directories under
# HOME and JIT defaults, read when something compiles, not at import. A harness process
# that imported SGLang itself (a unit test reading its classes) has them and a fresh one has
# not, while a process template has them once its own import ran; a server's processes get
# the harness's values either way (the whole environment goes with each start).
IMPORT_SET_ENV = (
    "CUDA_CACHE_PATH", "CUTE_DSL_CACHE_DIR", "DG_JIT_CACHE_DIR", "DG_JIT_USE_NVRTC", "FLASHINFER_WORKSPACE_BASE",
    "TILELANG_CACHE_DIR", "TLLM_LOG_LEVEL", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR",
    "TRITON_PTXAS_BLACKWELL_PATH",
)
# Ports SGLang picks for itself (0.5.23 ``PortArgs.init_new``: the process
# group's store port, ``nccl_port``, from ``get_free_port_below_ephemeral``,
# checked free when chosen and bound later by the ranks). A harness HTTP port
# drawn from the same range can be taken by a server starting beside it.
SGLANG_OWN_PORT_RANGE = (22000, 29999)
# What uvicorn logs when the HTTP port is taken; SGLang's launcher then does
# not exit (its lifespan joins the warm-up thread, which waits for a server
# that never answers), so the harness reads it off the log.
HTTP_BIND_FAILED = "error while attempting to bind on address"
# SGLang's own built-in scripted-runtime harness (0.5.2x; absent before). Its
# package __init__ installs tree-core inspectors from sglang.test.kits, which
# look for a Rust workspace the wheel does not ship (see hooks/upstream_harness.py).
UPSTREAM_HARNESS_PACKAGE = "sglang.test.scripted_runtime"
UPSTREAM_TREE_CORE_INSPECTION_MODULE = UPSTREAM_HARNESS_PACKAGE + ".tree_core_inspection"
# Engine arguments the upstream harness needs on CPU (0.5.23): it launches with
# the KV canary on (kv_canary="raise"), whose manager builds a device stream
# with torch.cpu.Stream(device=...), which CPU torch rejects (TypeError). Its
# two companion arguments go back to their defaults with it (validated together).
UPSTREAM_HARNESS_CPU_ARGS = {"kv_canary": "none", "kv_canary_real_data": "none", "kv_canary_sweep_interval": 0}
# ServerArgs a CPU server needs where the release has the field (applied in the
# server process, only when the caller did not set it): 0.5.13 enables
# piecewise CUDA graphs by default and dies on CPU ("module 'torch.cpu' has no
# attribute 'graph_pool_handle'"); 0.5.2x turns them off on CPU itself.
CPU_SERVER_ARGS = {"disable_piecewise_cuda_graph": True}

# The LoRA modules that pin host memory unconditionally (``torch.tensor(..., pin_memory=True)``,
# ``tensor.pin_memory()``), which raises without a CUDA driver (0.5.23; cpu_enablement item 6).
LORA_PIN_MEMORY_MODULES = (
    "sglang.srt.lora.layers",
    "sglang.srt.lora.lora",
    "sglang.srt.lora.backend.torch_backend",
)


def cpu_server_args(server_args_cls: type, given: dict) -> dict:
    import inspect

    fields = set(inspect.signature(server_args_cls).parameters)  # a dataclass in 0.5.13, not in 0.5.23
    return {k: v for k, v in CPU_SERVER_ARGS.items() if k in fields and k not in given}


def api_key_args(server_args_cls: type, key: str) -> dict:
    """The ServerArgs fields that put ``key`` on every HTTP endpoint: ``api_key``
    (the generate and query endpoints) and, where the release has it,
    ``admin_api_key`` (flush, weight updates, pause: SGLang's admin level).
    One key for both, so a call carries the same header whatever its level
    (with both set SGLang accepts only the admin key on admin endpoints and
    only the api key on the others)."""
    import inspect

    fields = set(inspect.signature(server_args_cls).parameters)
    return {name: key for name in ("api_key", "admin_api_key") if name in fields}


# The loops whose exceptions the hook reports before the scheduler dies.
EVENT_LOOP_METHODS = ("event_loop_normal", "event_loop_overlap", "event_loop_pp")


def parse_version(text: str) -> Tuple[int, ...]:
    """'0.5.12.post1' -> (0, 5, 12, 1); '0.5.23' -> (0, 5, 23, 0)."""
    nums = [int(n) for n in re.findall(r"\d+", text)]
    while len(nums) < 4:
        nums.append(0)
    return tuple(nums[:4])


@functools.lru_cache(maxsize=1)
def installed_sglang_version() -> Optional[str]:
    """The version of the sglang package this interpreter imports. A source
    tree on PYTHONPATH shadows the installed wheel, so its own version is
    read first: its generated ``_version.py`` if built, else ``git describe``
    of its checkout ('v0.5.12.post1-40-gabc' -> '0.5.12.post1'); the
    installed distribution's metadata otherwise."""
    pkg_dir = sglang_package_dir()
    if pkg_dir and "site-packages" not in pkg_dir:
        version = source_tree_version(pkg_dir)
        if version:
            return version
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def source_tree_version(pkg_dir: str) -> Optional[str]:
    import os
    import subprocess

    generated = os.path.join(pkg_dir, "_version.py")
    if os.path.isfile(generated):
        with open(generated) as f:
            found = re.search(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)", f.read())
        if found:
            return found.group(1)
    try:
        out = subprocess.run(["git", "-C", pkg_dir, "describe", "--tags", "--abbrev=0"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    tag = out.stdout.strip()
    return tag.lstrip("v") if out.returncode == 0 and tag else None


@dataclass(frozen=True)
class OmpBindRule:
    """How SGLANG_CPU_OMP_THREADS_BIND is read on CPU.

    0.5.23 wants one entry per rank of the whole world ('0|1|0|1' for pp=4);
    0.5.12.post1 wants one entry per TP rank ('0-1' for tp=1, pp=4).
    """

    per_world_rank: bool

    def value(self, *, tp_size: int, pp_size: int, cores: int) -> str:
        n = tp_size * pp_size if self.per_world_rank else tp_size
        if n == 1:
            return f"0-{cores - 1}" if cores > 1 else "0"
        return "|".join(str(i % cores) for i in range(n))


def needs_sgl_kernel_stub(version: Optional[str] = None) -> bool:
    """<=0.5.12.post1 imports sgl_kernel unconditionally and dies without
    libcuda; newer releases guard the import themselves and take a fallback
    when it fails, which a stub would defeat (their guarded code would call
    mocks). So only old releases get the stub."""
    version = version or installed_sglang_version() or "0"
    return parse_version(version) < (0, 5, 13, 0)


def sglang_package_dir() -> Optional[str]:
    """Directory of the sglang package this interpreter would import (not imported)."""
    import importlib.util
    import os

    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    return os.path.dirname(spec.origin) if spec is not None and spec.origin else None


def omp_bind_rule(version: Optional[str] = None, *, pkg_dir: Optional[str] = None) -> OmpBindRule:
    """By feature when the package can be read (source trees between releases
    too): 0.5.2x parses the variable in ``srt/utils/numa_utils.py``, one entry
    per world rank; 0.5.13 and older assert in ``model_runner`` that it has one
    entry per TP rank. By version otherwise (measured: 0.5.12.post1 and
    0.5.13 per TP rank, 0.5.23 per world rank)."""
    import os

    if version is None:
        pkg_dir = pkg_dir or sglang_package_dir()
        numa = os.path.join(pkg_dir or "", "srt", "utils", "numa_utils.py")
        if pkg_dir and os.path.isdir(pkg_dir):
            per_world = False
            if os.path.isfile(numa):
                with open(numa, errors="replace") as f:
                    per_world = "SGLANG_CPU_OMP_THREADS_BIND" in f.read()
            return OmpBindRule(per_world_rank=per_world)
        version = installed_sglang_version() or "0"
    return OmpBindRule(per_world_rank=parse_version(version) > (0, 5, 13, 0))


# ---------------------------------------------------------------------------
# Scheduler structure (read off the 0.5.23 wheel; older releases noted).


@dataclass(frozen=True)
class IterationEntry:
    """The method that starts every event-loop iteration, and where it lives.

    * 0.5.2x: ``Scheduler.ingest_requests`` (once per iteration, once per
      microbatch slot under PP);
    * 0.5.13 (and nearby): the loops call ``self.request_receiver.recv_requests()``
      on a ``SchedulerRequestReceiver`` component (a slotted frozen
      dataclass), built by ``Scheduler.init_request_receiver``;
    * <=0.5.12.post1: ``Scheduler.recv_requests``, called from the loops.
    """

    owner: type
    method: str
    on_receiver: bool  # the owner is the receiver component, not the Scheduler


def iteration_entry(scheduler_module: Any) -> IterationEntry:
    cls = scheduler_module.Scheduler
    for name in ("ingest_requests", "recv_requests"):
        if hasattr(cls, name):
            return IterationEntry(cls, name, False)
    receiver_cls = getattr(scheduler_module, "SchedulerRequestReceiver", None)
    if receiver_cls is not None and hasattr(receiver_cls, "recv_requests") \
            and hasattr(cls, "init_request_receiver"):
        return IterationEntry(receiver_cls, "recv_requests", True)
    raise RuntimeError(
        "scripted-runtime: this SGLang release has no known iteration entry (Scheduler.ingest_requests, "
        "Scheduler.recv_requests, or SchedulerRequestReceiver.recv_requests); add it to "
        "hooks/sglang_compat.iteration_entry")


def request_receiver(scheduler: Any) -> Any:
    """Object whose ``recv_from_tokenizer`` the scheduler polls (0.5.23: a
    SchedulerRequestReceiver component; older: the scheduler itself)."""
    return getattr(scheduler, "request_receiver", None) or scheduler


def swap_tokenizer_socket(scheduler: Any, make_proxy) -> Any:
    """Replace the socket the scheduler reads tokenizer input from with
    ``make_proxy(socket)``; returns the proxy."""
    holder = request_receiver(scheduler)
    proxy = make_proxy(holder.recv_from_tokenizer)
    # SchedulerRequestReceiver is a frozen dataclass in 0.5.23.
    object.__setattr__(holder, "recv_from_tokenizer", proxy)
    if holder is not scheduler and hasattr(scheduler, "recv_from_tokenizer"):
        scheduler.recv_from_tokenizer = proxy
    return proxy


def wrap_request_dispatcher(scheduler: Any, wrap) -> None:
    """Replace the function the scheduler hands each received request to
    (``Scheduler._request_dispatcher``) with ``wrap(dispatcher)``."""
    scheduler._request_dispatcher = wrap(scheduler._request_dispatcher)


def lora_manager(scheduler: Any) -> Any:
    """The scheduler's ``LoRAManager`` (0.5.23: on its model runner), or
    None without ``--enable-lora``."""
    if not getattr(scheduler, "enable_lora", False):
        return None
    return getattr(model_runner(scheduler), "lora_manager", None)


def lora_enabled(scheduler: Any) -> bool:
    return lora_manager(scheduler) is not None


def loaded_loras(scheduler: Any) -> Dict[str, str]:
    """lora_id -> name of every adapter the LoRA manager holds."""
    manager = lora_manager(scheduler)
    if manager is None:
        return {}
    return {lora_id: ref.lora_name for lora_id, ref in dict(getattr(manager, "lora_refs", {}) or {}).items()}


def loaded_lora_names(scheduler: Any) -> Tuple[str, ...]:
    return tuple(sorted(loaded_loras(scheduler).values()))


def max_loras_per_batch(scheduler: Any) -> int:
    """The adapters one batch may hold (the LoRA memory pool's slots; the
    base model counts as one); 0 without LoRA."""
    pool = getattr(lora_manager(scheduler), "memory_pool", None)
    return int(getattr(pool, "max_loras_per_batch", 0) or 0)


def dispatched_request_types() -> Tuple[str, ...]:
    """The request types (io_struct class names) the installed SGLang's
    scheduler dispatches, in registration order, read off the source of
    ``Scheduler.init_request_dispatcher`` (0.5.2x: a ``TypeBasedDispatcher``
    of ``(Type, handler)`` pairs). No scheduler is built; empty where the
    method is missing (an older release: the catalog is 0.5.23's)."""
    import inspect
    import re

    from sglang.srt.managers.scheduler import Scheduler

    method = getattr(Scheduler, "init_request_dispatcher", None)
    if method is None:
        return ()
    return tuple(re.findall(r"\(\s*([A-Z]\w+)\s*,", inspect.getsource(method)))


def is_fully_idle(scheduler: Any) -> bool:
    """The scheduler's own idle gate, the one flush_cache trusts."""
    if hasattr(scheduler, "is_fully_idle"):
        return bool(scheduler.is_fully_idle())
    return bool(scheduler._is_no_request())  # releases before is_fully_idle


def row_reuse_fence(scheduler: Any) -> Optional[str]:
    """What keeps a forward's reads of a row ordered before the next
    schedule's writes to it (issue 18744), or None if nothing does.

    0.5.13 added a coarse write-after-read barrier, 0.5.16 the read-done
    event; 0.5.2x enables it on CUDA (``_war_barrier_enabled``, through
    ``_apply_war_barrier`` after every launch). On CPU the forward runs
    synchronously inside ``run_batch``, so its reads are over before the
    scheduler writes again, barrier or not."""
    if getattr(scheduler, "_war_barrier_enabled", False):
        return "write-after-read barrier (_apply_war_barrier)"
    device = str(getattr(scheduler, "device", "") or getattr(getattr(scheduler, "server_args", None), "device", ""))
    if device == "cpu":
        return "synchronous CPU forward"
    return None


def is_paused(scheduler: Any) -> bool:
    return bool(getattr(scheduler, "_engine_paused", False))


def _msgpack_ipc(io: Any) -> bool:
    """Whether this release's tokenizer->scheduler frames are msgpack (0.5.2x
    with SGLANG_USE_PICKLE_IPC=0) rather than pickle (older releases, and
    0.5.2x by default)."""
    return getattr(io, "_USE_PICKLE_IPC", True) is False and hasattr(io, "msgpack_decode")


def decode_ipc_frame(raw: bytes) -> Any:
    """Decode one tokenizer->scheduler frame for inspection (not consumption)."""
    import pickle

    io = importlib.import_module(IO_STRUCT_MODULE)
    if _msgpack_ipc(io):
        obj = io.msgpack_decode(raw)
    else:
        obj = pickle.loads(raw)
    unwrap = getattr(io, "unwrap_from_pickle", None)
    if unwrap is not None and type(obj).__name__ == "PickleWrapper":
        obj = unwrap(obj)
    return obj


RESET_FLUSH_RID = "scripted-runtime-reset-flush"


def reset_flush_frame() -> Tuple[bytes, Any]:
    """A ``FlushCacheReqInput`` encoded as the tokenizer would send it (msgpack
    or pickle, as this release's IPC does), for the driver to hand the
    scheduler directly between scripts: the reset's flush without the HTTP
    round trip. It is marked with ``RESET_FLUSH_RID`` (releases whose request
    has no ``rid`` field take it as a plain attribute, which pickle keeps) so
    the driver can keep its answer from the tokenizer, which never asked.
    Read in the sources: 0.5.8.post1 and 0.5.12.post1 (dataclass with a
    ``rid`` field, pickle IPC) and 0.5.23 (msgspec struct, pickle by default,
    msgpack with SGLANG_USE_PICKLE_IPC=0) all build it with no arguments and
    send a non-None dispatcher answer to the tokenizer."""
    import pickle

    io = importlib.import_module(IO_STRUCT_MODULE)
    req = io.FlushCacheReqInput()
    try:
        req.rid = RESET_FLUSH_RID
    except (AttributeError, TypeError):  # a slotted type without rid: matched by type alone
        pass
    if _msgpack_ipc(io):
        return io.msgpack_encode(req), req
    return pickle.dumps(req, protocol=pickle.HIGHEST_PROTOCOL), req


def is_reset_flush(recv_req: Any, *, marked: bool = False) -> bool:
    """Whether the scheduler is dispatching a ``reset_flush_frame`` request.
    ``marked``: only one that carries ``RESET_FLUSH_RID`` (a rank that did
    not queue the flush itself cannot tell an unmarked one from a script's)."""
    default = None if marked else RESET_FLUSH_RID
    return (type(recv_req).__name__ == "FlushCacheReqInput"
            and getattr(recv_req, "rid", default) == RESET_FLUSH_RID)


def work_request_type_names() -> Tuple[str, ...]:
    return (
        "TokenizedGenerateReqInput",
        "TokenizedEmbeddingReqInput",
        "BatchTokenizedGenerateReqInput",
        "BatchTokenizedEmbeddingReqInput",
    )


def rank_info(scheduler: Any) -> Tuple[int, int, int, int]:
    """(pp_rank, tp_rank, pp_size, tp_size) of this scheduler process."""
    try:  # 0.5.2x: ranks live in the runtime context
        from sglang.srt.runtime_context import get_parallel

        p = get_parallel()
        return p.pp_rank, p.tp_rank, p.pp_size, p.tp_size
    except Exception:
        pass
    ps = getattr(scheduler, "ps", None)  # 0.5.13: a ParallelState dataclass on the scheduler
    if ps is not None and hasattr(ps, "pp_rank"):
        return ps.pp_rank, ps.tp_rank, ps.pp_size, ps.tp_size
    return (  # <=0.5.12.post1 keeps them on the scheduler itself
        getattr(scheduler, "pp_rank", 0),
        getattr(scheduler, "tp_rank", 0),
        getattr(scheduler, "pp_size", 1),
        getattr(scheduler, "tp_size", 1),
    )


def loop_kind(scheduler: Any) -> str:
    """'pp', 'overlap' or 'normal': which event loop this scheduler runs
    (fixed for the process; cached on the scheduler, read every step)."""
    cached = getattr(scheduler, "__dict__", {}).get("_scripted_runtime_loop_kind")
    if cached is not None:
        return cached
    _, _, pp_size, _ = rank_info(scheduler)
    if pp_size > 1:
        kind = "pp"
    elif getattr(scheduler, "enable_overlap", False):
        kind = "overlap"
    else:
        kind = "normal"
    if hasattr(scheduler, "__dict__"):
        scheduler.__dict__["_scripted_runtime_loop_kind"] = kind
    return kind


# ---------------------------------------------------------------------------
# Memory pools (0.5.23: TokenToKVPoolAllocator keeps free_pages and
# release_pages tensors of page ids; per-request KV bookkeeping lives in
# req.kv with kv_allocated_len and cache_protected_len).


def allocator_free_index_parts(allocator: Any) -> Optional[List[Any]]:
    """Every free KV token index of the allocator, as the tensors that hold
    them (``free_pages`` and ``release_pages``; not concatenated: the caller
    marks them one by one, and a cat per iteration costs more than it saves),
    or None when this allocator's free list is not readable. The tensors are
    replaced, never written in place (``alloc`` keeps a suffix view,
    ``free`` concatenates): the invariants' incremental count relies on it.
    Read after every iteration, so it keeps to a few calls."""
    import torch

    parts = [p for p in (getattr(allocator, "free_pages", None), getattr(allocator, "release_pages", None))
             if isinstance(p, torch.Tensor)]
    if not parts:
        return None
    page_size = getattr(allocator, "page_size", 1) or 1
    if page_size == 1:
        return parts
    offsets = torch.arange(page_size, dtype=parts[0].dtype, device=parts[0].device)
    return [(pages[:, None] * page_size + offsets[None, :]).reshape(-1) for pages in parts]


def uncached_tokens(reqs: Any, page_size: int) -> Optional[int]:
    """KV tokens that requests own outside the radix tree, counted as SGLang's
    own invariant checker does (0.5.2x: ceil(kv_allocated_len) -
    cache_protected_len); None where the release lacks those fields."""
    total = 0
    for req in reqs:
        kv = getattr(req, "kv", None)
        if kv is None or not hasattr(kv, "cache_protected_len"):
            return None
        allocated = -(-int(kv.kv_allocated_len) // page_size) * page_size
        total += allocated - int(kv.cache_protected_len)
    return total


class _ScriptHeldKv:
    """Wraps SGLang's pool-stats observer so its own idle leak check counts KV
    a script took with ``ctx.exhaust_kv`` as held (0.5.2x: "session_held")."""

    def __init__(self, inner: Any, held: int) -> None:
        self._inner, self._held = inner, held

    def session_held_tokens(self) -> int:
        return self._inner.session_held_tokens() + self._held

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def set_script_held_tokens(scheduler: Any, tokens: int) -> bool:
    """Tell SGLang's own pool-leak check (0.5.2x ``invariant_checker``, run at
    every idle iteration) about ``tokens`` KV slots a script holds; without it
    the check kills the scheduler once the engine idles. False where the
    release has no such check."""
    checker = getattr(scheduler, "invariant_checker", None)
    if checker is None or not hasattr(checker, "pool_stats_observer"):
        return False
    inner = checker.pool_stats_observer
    if isinstance(inner, _ScriptHeldKv):
        inner = inner._inner
    checker.pool_stats_observer = _ScriptHeldKv(inner, tokens) if tokens else inner
    return True


def output_top_logprobs(req: Any) -> Optional[List[List[float]]]:
    """The top-k logprobs of each output token of a request posted with
    ``return_logprob`` and ``top_logprobs_num`` (0.5.23 keeps them on
    ``req.logprob``; earlier releases on the request itself), or None."""
    holder = getattr(req, "logprob", None) or req
    values = getattr(holder, "output_top_logprobs_val", None)
    if values is None:
        return None
    return [[float(v) for v in row] for row in values]


def request_logprobs(req: Any) -> Optional[Dict[str, Any]]:
    """What SGLang recorded of a ``return_logprob`` request's logprobs, or None
    for a request that did not ask for them. 0.5.23 keeps them on
    ``req.logprob`` (earlier releases on the request itself): ``input_val``
    and ``input_idx`` (one entry per prompt token from the logprob start on,
    the first value None; None until the prefill's last chunk), ``output_val``
    and ``output_idx`` (one per output token SGLang committed), ``top_val``
    and ``top_idx`` (the ``top_logprobs_num`` best per output token),
    ``top_n``, and ``start`` (``logprob_start_len`` as the scheduler holds it)."""
    if not getattr(req, "return_logprob", False):
        return None
    holder = getattr(req, "logprob", None) or req

    def rows(name: str) -> Optional[List[Any]]:
        value = getattr(holder, name, None)
        return None if value is None else list(value)

    return {
        "input_val": rows("input_token_logprobs_val"),
        "input_idx": rows("input_token_logprobs_idx"),
        "output_val": rows("output_token_logprobs_val") or [],
        "output_idx": rows("output_token_logprobs_idx") or [],
        "top_val": [list(r) for r in rows("output_top_logprobs_val") or []],
        "top_idx": [list(r) for r in rows("output_top_logprobs_idx") or []],
        "top_n": int(getattr(holder, "top_logprobs_num", 0) or 0),
        "start": getattr(req, "logprob_start_len", None),
        "retracted": bool(getattr(req, "is_retracted", False)),
    }


def evict_cache(scheduler: Any, num_tokens: int) -> int:
    """Evict up to ``num_tokens`` of the radix tree's evictable (unlocked)
    KV back to the allocator, as SGLang's own allocation path does under
    memory pressure (0.5.2x: ``tree_cache.evict(EvictParams(num_tokens=N))``
    returning an ``EvictResult``; older releases took the count and returned
    nothing); returns the tokens evicted (measured on the tree, so either
    form reports the same)."""
    tree = scheduler.tree_cache
    before = int(tree.evictable_size())
    if num_tokens <= 0 or before <= 0:
        return 0
    try:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams
    except ImportError:
        tree.evict(num_tokens)
    else:
        tree.evict(EvictParams(num_tokens=num_tokens))
    return before - int(tree.evictable_size())


def flush_ignores_waiting_while_paused(scheduler: Any) -> bool:
    """Whether this release's ``flush_cache`` lets waiting requests be
    during a pause (0.5.21+: ``is_fully_idle(ignore_waiting=self._engine_paused)``,
    so a flush after ``pause_generation(retract)`` is accepted); read off
    ``is_fully_idle``'s parameters."""
    import inspect

    gate = getattr(scheduler, "is_fully_idle", None)
    if gate is None:
        return False
    try:
        return "ignore_waiting" in inspect.signature(gate).parameters
    except (TypeError, ValueError):
        return False


# --- release/resume_memory_occupation (the RL weight-sync cycle) --------------
# The tags SGLang's release/resume take (sglang.srt.constants; the same three
# names since 0.4.x's multi-stage awake, PR 7099): no tags means all of them.
MEMORY_TAGS = ("kv_cache", "weights", "cuda_graph")


def weight_updater(scheduler: Any) -> Any:
    """The object that handles release/resume: 0.5.2x's
    ``scheduler.weight_updater`` (``scheduler_components/weight_updater.py``);
    older releases handle them on the scheduler itself (a mixin)."""
    return getattr(scheduler, "weight_updater", None) or scheduler


def released_memory_tags(scheduler: Any) -> Tuple[str, ...]:
    """The memory tags released and not resumed yet, as SGLang tracks them
    (``offload_tags``, a set: release adds, resume removes), sorted."""
    tags = getattr(weight_updater(scheduler), "offload_tags", None)
    if tags is None:
        tags = getattr(scheduler, "offload_tags", None)
    return tuple(sorted(tags or ()))


def memory_release_allowed(scheduler: Any) -> bool:
    """SGLang's precondition of ``release_memory_occupation`` (0.5.23
    ``weight_updater.py``: ``assert self.is_fully_idle(ignore_waiting=
    scheduler._engine_paused)``; older releases assert plain idleness),
    evaluated now. False means the scheduler would die on the assert."""
    gate = getattr(scheduler, "is_fully_idle", None)
    if gate is None:
        return is_fully_idle(scheduler)
    if flush_ignores_waiting_while_paused(scheduler):
        return bool(gate(ignore_waiting=is_paused(scheduler)))
    return bool(gate())


def memory_saver_is_real(scheduler: Any) -> bool:
    """Whether release/resume really unmaps memory (torch_memory_saver, with
    ``--enable-memory-saver`` on a GPU) rather than doing nothing (SGLang's
    ``_TorchMemorySaverAdapterNoop``, the CPU default): only then is the
    content of a released region lost by SGLang itself."""
    adapter = getattr(weight_updater(scheduler), "memory_saver_adapter", None)
    if adapter is None:
        adapter = getattr(scheduler, "memory_saver_adapter", None)
    return adapter is not None and "Noop" not in type(adapter).__name__


def weights_cpu_backup(scheduler: Any) -> bool:
    """Whether released weights keep their content (``--enable-weights-cpu-backup``:
    torch_memory_saver copies the weights region to the host on release)."""
    args = getattr(scheduler, "server_args", None)
    return bool(getattr(args, "enable_weights_cpu_backup", False))


def kv_data_buffers(scheduler: Any) -> List[Any]:
    """The KV pool's data tensors (per-layer K and V, or MLA's fused
    buffers) of this rank: what SGLang allocates in the ``kv_cache`` memory
    region, besides ``req_to_token``."""
    pool = getattr(getattr(scheduler, "token_to_kv_pool_allocator", None), "_kvcache", None)
    if pool is None:
        pool = getattr(getattr(scheduler, "tp_worker", None), "model_runner", None)
        pool = getattr(pool, "token_to_kv_pool", None)
    buffers: List[Any] = []
    for name in ("k_buffer", "v_buffer", "kv_buffer"):
        got = getattr(pool, name, None)
        if got is None:
            continue
        buffers.extend(got if isinstance(got, (list, tuple)) else [got])
    return buffers


def model_runner(scheduler: Any) -> Any:
    """This rank's model runner (on the TP worker, or on the worker it wraps)."""
    worker = getattr(scheduler, "tp_worker", None)
    return getattr(worker, "model_runner", None) or getattr(getattr(worker, "worker", None), "model_runner", None)


def served_model(scheduler: Any) -> Any:
    """The model this rank serves (its parameters and buffers)."""
    return getattr(model_runner(scheduler), "model", None)


# --- init_weights_update_group / update_weights_from_distributed (a trainer's broadcast) --------------
# 0.5.23: the model runner's WeightUpdater keeps the groups by name (``_model_update_group``); the
# scheduler's handler refuses a distributed update outside a begin/end session before it receives,
# and the receive asserts the group (model_executor/model_runner_components/weight_updater.py).
DISTRIBUTED_UPDATE_TYPE = "UpdateWeightsFromDistributedReqInput"


def model_weight_updater(scheduler: Any) -> Any:
    """The model runner's weight updater (the one holding the process groups
    a trainer broadcasts over), None where this release has none."""
    return getattr(model_runner(scheduler), "weight_updater", None)


def weight_update_groups(scheduler: Any) -> Tuple[str, ...]:
    """The names of the weight-update process groups this rank joined
    (``init_weights_update_group``) and has not destroyed, sorted."""
    return tuple(sorted(getattr(model_weight_updater(scheduler), "_model_update_group", None) or ()))


def distributed_update_receives(scheduler: Any, recv_req: Any) -> bool:
    """Whether SGLang's handler, given ``recv_req`` now, receives the
    trainer's broadcast: a weight-update session is open (else it answers
    ``success=False`` first) and the group is initialized (else the receive
    asserts)."""
    return (weight_update_session_open(scheduler)
            and getattr(recv_req, "group_name", None) in weight_update_groups(scheduler))


def distributed_update_supported(scheduler: Any) -> Optional[str]:
    """None when the harness can run a trainer rank for this server; else why not."""
    pp_size = rank_info(scheduler)[2] or 1
    if pp_size > 1:
        return (f"init_weights_update_group under PP (pp_size {pp_size}): every pipeline stage joins the group as "
                "rank rank_offset + tp_rank, the same rank for each stage (read off 0.5.23's "
                "WeightUpdater.init_weights_update_group), so a trainer cannot form it; use update_weights_from_disk")
    return None


# Where SGLang's own group constructor lives (the scheduler's side of the join); the trainer's
# side below mirrors it, and tests/logic/test_sglang_compat.py reads its source to keep them alike.
CUSTOM_PROCESS_GROUP_FUNCTION = ("sglang.srt.utils.common", "init_custom_process_group")


def join_custom_process_group(*, backend: str, init_method: str, world_size: int, rank: int,
                              group_name: str) -> Any:
    """Join the group the scheduler's ``init_weights_update_group`` joins,
    as SGLang's ``init_custom_process_group`` (0.5.23, utils/common.py)
    builds it: the rendezvous store wrapped in ``PrefixStore(group_name)``,
    then torch's group helper, ranks mapped one to one. Mirrored here with
    torch alone so the trainer rank does not import SGLang (3.6 s of its
    5 s start on 2 cores, measured)."""
    import torch
    from torch.distributed.distributed_c10d import (Backend, PrefixStore, _new_process_group_helper, _world,
                                                    default_pg_timeout, rendezvous)

    store, rank, world_size = next(rendezvous(init_method, rank, world_size, timeout=default_pg_timeout))
    store.set_timeout(default_pg_timeout)
    store = PrefixStore(group_name, store)
    options = ("backend_options" if tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 6)
               else "pg_options")
    pg, _ = _new_process_group_helper(world_size, rank, [], Backend(backend), store, group_name=group_name,
                                      **{options: None}, timeout=default_pg_timeout)
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


# --- runtime knobs and weight queries (set_internal_state, slow_down, update_weight_version,
# get_weights_by_name, weights_checker) -----------------------------------------------------
# The one set_internal_state key the CPU default can change (0.5.23 internal_state.py
# _update_handlers: the others need speculative decoding or a DSpark draft worker).
MICRO_BATCH_KNOB = "pp_max_micro_batch_size"


def _runtime_context() -> Any:
    try:
        import sglang.srt.runtime_context as rc  # 0.5.2x: config lives in the runtime context
    except ImportError:
        return None
    return rc


def profiler_state(scheduler: Any) -> Dict[str, Any]:
    """The torch profiler's state on this rank (0.5.23
    ``SchedulerProfilerManager``): ``in_progress``, ``forward_ct`` (the
    scheduler's forward count) and ``output_dir``."""
    manager = getattr(scheduler, "profiler_manager", None)
    return {"in_progress": bool(getattr(manager, "profile_in_progress", False)),
            "forward_ct": int(getattr(scheduler, "forward_ct", 0) or 0),
            "output_dir": getattr(manager, "torch_profiler_output_dir", None)}


def root_log_level() -> str:
    """The root logger's level name in this process (what ``configure_logging`` sets)."""
    import logging

    return logging.getLevelName(logging.getLogger().level)


def micro_batch_limit(scheduler: Any) -> Optional[int]:
    """The requests one (PP micro)batch may hold, as admission reads it now
    (0.5.23 ``get_num_allocatable_reqs``: ``get_parallel().pp_max_micro_batch_size
    - running_bs``; also at pp_size 1). None on a release without it."""
    rc = _runtime_context()
    if rc is not None:
        try:
            value = rc.get_parallel().pp_max_micro_batch_size
            return None if value is None else int(value)
        except Exception:  # noqa: BLE001 - an older layout
            pass
    value = getattr(getattr(scheduler, "server_args", None), MICRO_BATCH_KNOB, None)
    return None if value is None else int(value)


def micro_batch_limit_range(scheduler: Any) -> Tuple[int, int]:
    """The values set_internal_state accepts for the limit (0.5.23
    ``_validate_pp_micro_batch_size``: ``[1, max_running_requests // pp_size]``)."""
    pp_size = rank_info(scheduler)[2] or 1
    return 1, int(getattr(scheduler, "max_running_requests", 0)) // pp_size


def forward_sleep_time(scheduler: Any) -> Optional[float]:
    """What ``slow_down`` set: seconds ``run_batch`` sleeps before each
    forward, or None (0.5.23 ``Scheduler.slow_down``: a value <= 0 clears it)."""
    return getattr(scheduler, "forward_sleep_time", None)


def served_weight_version() -> Optional[str]:
    """The weight-version label the scheduler serves (``update_weight_version``)."""
    rc = _runtime_context()
    if rc is None:
        return None
    try:
        return rc.get_serving().weight_version
    except Exception:  # noqa: BLE001 - an older layout
        return None


def weight_checker_snapshot(scheduler: Any) -> Optional[bool]:
    """Whether the model runner's weight checker holds a snapshot
    (``check_weights(action="snapshot")``; a ``compare`` consumes it), or
    None where this release has no weight checker."""
    checker = getattr(model_runner(scheduler), "_weight_checker", None)
    if checker is None:
        return None
    return getattr(checker, "_snapshot_tensors", None) is not None


def weight_check_skips(name: str, tensor: Any) -> bool:
    """Whether SGLang's weight checker leaves tensor ``name`` out of its
    checksums and compares (0.5.23 ``utils/weight_checker.py``
    ``_is_skip_weight_check``: non-persistent buffers, tensors flagged
    ``_skip_weight_check``); False where this release has no checker."""
    try:
        from sglang.srt.utils import weight_checker
    except ImportError:
        return False
    skip = getattr(weight_checker, "_is_skip_weight_check", None)
    return bool(skip(name, tensor)) if skip is not None else False


def model_device_type(scheduler: Any) -> Optional[str]:
    """``"cpu"``, ``"cuda"``, ... : where this rank's model lives."""
    model = served_model(scheduler)
    if model is None:
        return None
    for p in model.parameters():
        return p.device.type
    return None


# check_weights actions that run only on a CUDA device in 0.5.23: the comparator moves every
# chunk with ``.cuda()`` (utils/weight_checker_comparator.py RawComparable.iter_chunks), so on
# the CPU default ``compare`` answers success=False ("Cannot re-initialize CUDA in forked
# subprocess" with a CUDA build of torch, measured 2026-11-26).
CHECK_WEIGHTS_CUDA_ONLY = ("compare",)


def weight_update_session_open(scheduler: Any) -> bool:
    """Whether a weight-update session is open (0.5.23: ``begin_weight_update``
    opened one, ``end_weight_update`` has not closed it; a tensor update needs one)."""
    return getattr(weight_updater(scheduler), "_session", None) is not None


def cpu_tensor_update_supported(scheduler: Any, what: str = "update_weights_from_tensor") -> Optional[str]:
    """None when this server can take CPU tensors over
    ``/update_weights_from_tensor`` (or another route of the same payload,
    ``what``: ``/load_lora_adapter_from_tensors``) from the harness; else
    why not, naming ``what``. CPU
    tensors travel as shared memory (SGLang's unpickler allows no tensor by
    value), and under PP every rank rebuilds the same payload: with torch's
    default descriptor passing the second rank got ``EOFError in recvfds``,
    with shared files ``unable to open shared memory object`` (both killed
    the scheduler, measured at pp4 on 0.5.23)."""
    pp_size = rank_info(scheduler)[2] or 1
    if model_device_type(scheduler) in (None, "cpu") and pp_size > 1:
        return (f"{what} with CPU tensors under PP (pp_size {pp_size}): every rank rebuilds the "
                "same shared-memory payload and only one can (measured: the scheduler dies); use "
                "update_weights_from_disk, or a GPU runner, where the tensors are CUDA IPC handles")
    return None


def multiprocessing_tempdir_in_the_workdir() -> Optional[str]:
    """Put this process's ``multiprocessing`` temporary directory in its
    server's work directory (beside ``crashes/``, whose path the harness
    passes in ``SCRIPTED_RUNTIME_CRASH_DIR``) unless it has one already;
    returns it (None outside a harness server).

    torch pickles a CPU tensor's storage as a file descriptor, which
    ``multiprocessing``'s resource sharer hands over through a socket in
    that directory (``pymp-*``, by default under the system's temp dir),
    removed only when the process exits cleanly. A server's processes are
    killed at shutdown, so every server whose scheduler serialized a tensor
    update left a ``/tmp/pymp-*`` behind (172 after a day of running the
    suite, measured); in the work directory it goes with it
    (``workdirs.prune_stale``)."""
    import tempfile
    from multiprocessing import process

    from scripted_runtime import protocol

    config = process.current_process()._config  # where multiprocessing.util.get_temp_dir keeps it
    if config.get("tempdir"):
        return config["tempdir"]
    crash_dir = os.environ.get(protocol.ENV_CRASH_DIR)
    if not crash_dir or not os.path.isdir(os.path.dirname(crash_dir)):
        return None
    config["tempdir"] = tempfile.mkdtemp(prefix="pymp-", dir=os.path.dirname(crash_dir))
    return config["tempdir"]


def serialize_named_tensors(scheduler: Any, named_tensors: List[Any]) -> List[str]:
    """``named_tensors`` as ``/update_weights_from_tensor`` takes them: what
    SGLang's ``MultiprocessingSerializer.serialize(..., output_str=True)``
    gives (a ``ForkingPickler`` dump, base64), one copy per TP rank (each
    rank deserializes its own index). One process only can rebuild it on
    CPU (``cpu_tensor_update_supported``).

    Pickled with torch's own tensor reducer, not the one in force: SGLang's
    ``monkey_patch_torch_reductions`` (applied in this process by the
    scheduler's first tensor update) rewrites argument 6 of every reduced
    tensor as a CUDA device uuid, and a CPU tensor's reduction has no
    argument 6 (``IndexError: tuple index out of range``, measured on
    0.5.23). The scheduler's side is unchanged: it rebuilds CPU tensors
    with torch's own functions."""
    import base64
    import io
    from multiprocessing.reduction import ForkingPickler

    import torch
    from torch.multiprocessing import reductions

    multiprocessing_tempdir_in_the_workdir()
    reduce = getattr(reductions, "_reduce_tensor_original", reductions.reduce_tensor)
    buf = io.BytesIO()
    pickler = ForkingPickler(buf)
    pickler.dispatch_table[torch.Tensor] = reduce
    pickler.dispatch_table[torch.nn.parameter.Parameter] = reduce
    pickler.dump(named_tensors)
    text = base64.b64encode(buf.getvalue()).decode("ascii")
    tp_size = rank_info(scheduler)[3] or 1
    return [text] * tp_size


def _session(scheduler: Any, session_id: Optional[str]) -> Any:
    """SGLang's ``Session`` object of ``session_id``, or None."""
    return (getattr(getattr(scheduler, "session_controller", None), "sessions", None) or {}).get(session_id)


def open_sessions(scheduler: Any) -> Tuple[str, ...]:
    """The ids of the sessions SGLang holds open (``session_controller``), sorted."""
    sessions = getattr(getattr(scheduler, "session_controller", None), "sessions", None) or {}
    return tuple(sorted(sessions))


def session_closing(scheduler: Any, session_id: str) -> bool:
    """Whether ``session_id`` is open with its close deferred until its request finishes."""
    return bool(getattr(_session(scheduler, session_id), "close_on_finish", False))


def session_has_unfinished_request(scheduler: Any, session_id: str) -> bool:
    """Whether a request of session ``session_id`` is unfinished (in flight,
    or its last request node not finished): what makes 0.5.23's
    ``SessionController._close`` defer the close."""
    session = _session(scheduler, session_id)
    if session is None:
        return False
    if getattr(session, "_inflight", False):
        return True
    nodes = getattr(session, "req_nodes", None) or {}
    return any(not node.req.finished() for node in nodes.values() if getattr(node, "req", None) is not None)


# ---------------------------------------------------------------------------
# Priority scheduling (read off 0.5.23: scheduler.py 486-496 and 1468-1472, schedule_policy.py
# 526-536 and 1707-1778, observability/req_time_stats.py 776-800; docs/checks.md, "The priority contract").


@dataclass(frozen=True)
class PrioritySettings:
    """How a scheduler with priority scheduling on orders and preempts.
    ``sign``: pref(r) = r.priority * sign, smaller is better (1 when low
    values go first, else -1); ``threshold``: a running request is
    preempted only by one whose pref is smaller by more than it; ``fcfs``:
    the waiting queue is sorted by (pref, wait-queue entry time) (the other
    policy priority allows, ``lof``, sorts by length instead)."""

    sign: int
    threshold: int
    preemption: bool
    fcfs: bool


def priority_settings(scheduler: Any) -> Optional[PrioritySettings]:
    """None unless the scheduler runs with priority scheduling on."""
    if not getattr(scheduler, "enable_priority_scheduling", False):
        return None
    policy = getattr(getattr(scheduler, "policy", None), "policy", None)
    name = str(getattr(policy, "value", policy) or getattr(scheduler, "schedule_policy", None) or "fcfs").lower()
    return PrioritySettings(
        sign=1 if getattr(scheduler, "schedule_low_priority_values_first", False) else -1,
        threshold=int(getattr(scheduler, "priority_scheduling_preemption_threshold", 10) or 0),
        preemption=bool(getattr(scheduler, "enable_priority_preemption", False)),
        fcfs=name.endswith("fcfs"))


def priority_entry(req: Any) -> Tuple[str, int, float, bool]:
    """(rid, priority, wait-queue entry time, retracted): what admission
    sorts a waiting request by (the entry time is stamped again at every
    (re)queue, ``set_wait_queue_entry_time``) and whether it was retracted
    (a preemption victim's ``reset_for_retract``)."""
    stats = getattr(req, "time_stats", None)
    return (req.rid, int(getattr(req, "priority", 0) or 0),
            float(getattr(stats, "wait_queue_entry_time", 0.0) or 0.0), bool(getattr(req, "is_retracted", False)))


# ---------------------------------------------------------------------------
# A request's fill ids (the fill_ids contract, scheduler_side/fill_ids_contract.py).
# 0.5.23: ``Req.full_untruncated_fill_ids`` is the sequence an extend reads
# from (``extend_end`` cuts it) and the release's checkpoint inserts into the
# radix tree; ``Req.refresh_fill_ids`` keeps it "== origin_input_ids +
# output_ids" (its docstring) and ``init_next_round_input`` runs it whenever a
# request is admitted, a fresh one, the next chunk of a chunked one, or one
# resumed after a retraction. Older releases keep ``fill_ids`` and rebuild it
# there (not judged: no such attribute).
FILL_IDS_ATTR = "full_untruncated_fill_ids"


def fill_ids_desync(req: Any) -> Optional[Tuple[str, int, int, int, int]]:
    """``(rid, len(fill ids), len(prompt), len(output), first differing
    position)`` when an admitted request's fill ids are not its prompt
    followed by its output so far, else None (also where the release has no
    such fields, or for a finished request or a diffusion LM's, whose fill
    ids carry a mask block)."""
    fill = getattr(req, FILL_IDS_ATTR, None)
    if fill is None or req.finished():
        return None
    is_dllm = getattr(req, "is_dllm", None)
    if callable(is_dllm) and is_dllm():
        return None
    origin, output = req.origin_input_ids, req.output_ids
    n_in, n_out = len(origin), len(output)
    expected = list(origin) + list(output)
    got = list(fill)
    if got == expected:
        return None
    first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    return (req.rid, len(got), n_in, n_out, first)


# ---------------------------------------------------------------------------
# A prefill pass's admission (the admission_budget contract,
# scheduler_side/admission_contract.py). 0.5.23: ``Scheduler.
# get_new_batch_prefill`` builds a ``PrefillAdder`` whose ``PrefillBudget``
# (``mem_cache/prefill_budget.py``) admits a waiting request only if its
# extend and its new tokens (``min(max_new_tokens - len(output_ids),
# CLIP_MAX_NEW_TOKENS)``) fit in the free plus evictable KV less what the
# pass already reserved; it returns a ``NextBatchPlan`` (``batch_to_run``),
# older releases the batch itself.
PREFILL_PASS_METHOD = "get_new_batch_prefill"
SCHEDULE_POLICY_MODULE = "sglang.srt.managers.schedule_policy"


# The schedule policy's call counters (``SchedulePolicy`` in 0.5.23's
# ``managers/schedule_policy.py``). Under a cache-agnostic policy (the
# default ``fcfs``), LRU eviction and a tree without a fast match (the CPU
# default's), every ``WAITING_PREFIX_REFRESH_INTERVAL``-th (32nd) prefill pass
# with a waiting request touches the waiting requests' prefixes
# (``_touch_waiting_prefixes``),
# a radix match that splits a node where a waiting prompt ends inside it;
# the other counter only spaces a log line. ``flush_cache`` keeps them, so
# which pass of a script the touch landed on depended on how many passes
# the scripts before it took: the same program split a node one iteration
# earlier or later (measured: 7 of 30 pairs of runs of one pp1-normal
# program differed in ``tree_nodes``). The harness's reset starts them from
# 0 on every rank (``restart_policy_call_counters``); a release without
# them reads None.
POLICY_CALL_COUNTERS = ("_waiting_prefix_refresh_calls", "_shortest_prefill_calls")


def policy_call_counters(scheduler: Any) -> Optional[Tuple[Tuple[str, int], ...]]:
    """The schedule policy's call counters, by name (None: it has none)."""
    policy = getattr(scheduler, "policy", None)
    found = tuple((name, int(getattr(policy, name))) for name in POLICY_CALL_COUNTERS
                  if isinstance(getattr(policy, name, None), int))
    return found or None


def restart_policy_call_counters(scheduler: Any) -> None:
    """Start the schedule policy's call counters from 0, as a fresh engine's."""
    policy = getattr(scheduler, "policy", None)
    for name in POLICY_CALL_COUNTERS:
        if isinstance(getattr(policy, name, None), int):
            setattr(policy, name, 0)


def admission_unjudged(scheduler: Any) -> Optional[str]:
    """Why this scheduler's admission is not judged by the admission budget
    (None: it is). Only the plain single-pool budget is: the SWA, Mamba and
    HiCache budgets count other pools or move KV in the pass (a load-back
    may write device victims back and free them), priority preemption frees
    running requests' KV within the pass, and a disabled radix tree admits
    ``ignore_eos`` requests by another rule."""
    if getattr(scheduler, "is_hybrid_swa", False):
        return "a hybrid SWA pool"
    tree = getattr(scheduler, "tree_cache", None)
    if tree is None or getattr(tree, "disable", False):
        return "the radix tree disabled"
    supports_mamba = getattr(tree, "supports_mamba", None)
    if callable(supports_mamba) and supports_mamba():
        return "a Mamba pool"
    if getattr(scheduler, "enable_hierarchical_cache", False):
        return "HiCache"
    if getattr(scheduler, "enable_priority_preemption", False):
        return "priority preemption"
    if getattr(scheduler, "dllm_config", None) is not None:
        return "a diffusion LM"
    return None


def admission_room(scheduler: Any) -> Tuple[int, int, int]:
    """(free, evictable, page): the KV tokens a prefill pass's budget starts
    from, and the page each admission is charged on top of its tokens
    (``PrefillAdder.per_req_token_overhead``, a page without KV sharding)."""
    allocator = scheduler.token_to_kv_pool_allocator
    return (int(allocator.available_size()), int(scheduler.tree_cache.evictable_size()),
            int(getattr(allocator, "page_size", 1) or 1))


def prefill_pass_batch(returned: Any) -> Any:
    """The batch a prefill pass made (None when it made none)."""
    return getattr(returned, "batch_to_run", returned)


def _clip_max_new_tokens() -> int:
    module = sys.modules.get(SCHEDULE_POLICY_MODULE)
    return int(getattr(module, "CLIP_MAX_NEW_TOKENS", 4096))


def admitted_new_tokens(req: Any) -> int:
    """The new tokens admission charges a request for (its decode headroom)."""
    new = int(getattr(req.sampling_params, "max_new_tokens", 0) or 0) - len(getattr(req, "output_ids", ()) or ())
    return max(0, min(new, _clip_max_new_tokens()))


# ---------------------------------------------------------------------------
# pause_generation(abort)'s polling loop (hooks/pause_abort_wake.py).
# 0.5.23 TokenizerManager.pause_generation, mode abort: ``while True:
# self.abort_request(abort_all=True); if not await
# self.model_update_lock.is_locked(): break; await asyncio.sleep(1.0)``, the
# lock an ``utils/aio_rwlock.RWLock`` (``_cond`` notified when the last
# reader leaves; ``_readers``, ``_writer_active``).
PAUSE_ABORT_POLL_NAMES = ("abort_request", "model_update_lock", "is_locked", "sleep", "asyncio")


def pause_abort_poll(pause_generation: Any) -> bool:
    """Whether ``pause_generation`` is the polling loop above (by the names
    its code uses: a release that waits another way is left alone)."""
    code = getattr(pause_generation, "__code__", None)
    return code is not None and all(name in code.co_names for name in PAUSE_ABORT_POLL_NAMES)
