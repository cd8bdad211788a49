"""Every SGLang-version difference the harness knows about, in one place.

Supporting a new SGLang release means editing this module (and its tests in
tests/test_sglang_compat.py), not grepping the tree. Each fact names the
releases it was read off. Where a feature test is possible it is preferred to
a version comparison, so that source trees between releases also work.
"""
from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass
from typing import Any, Optional, Tuple

SCHEDULER_MODULE = "sglang.srt.managers.scheduler"
IO_STRUCT_MODULE = "sglang.srt.managers.io_struct"
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
# The loops whose exceptions the hook reports before the scheduler dies.
EVENT_LOOP_METHODS = ("event_loop_normal", "event_loop_overlap", "event_loop_pp")


def parse_version(text: str) -> Tuple[int, ...]:
    """'0.5.12.post1' -> (0, 5, 12, 1); '0.5.23' -> (0, 5, 23, 0)."""
    nums = [int(n) for n in re.findall(r"\d+", text)]
    while len(nums) < 4:
        nums.append(0)
    return tuple(nums[:4])


def installed_sglang_version() -> Optional[str]:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


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


def omp_bind_rule(version: str) -> OmpBindRule:
    return OmpBindRule(per_world_rank=parse_version(version) >= (0, 5, 13, 0))


# ---------------------------------------------------------------------------
# Scheduler structure (read off the 0.5.23 wheel; older releases noted).


def iteration_entry_name(scheduler_cls: type) -> str:
    """The Scheduler method that starts every event-loop iteration.

    0.5.23 funnels input through ``ingest_requests`` (once per iteration, once
    per microbatch slot under PP). Older releases call ``recv_requests``
    directly from the loops.
    """
    if hasattr(scheduler_cls, "ingest_requests"):
        return "ingest_requests"
    return "recv_requests"


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


def is_fully_idle(scheduler: Any) -> bool:
    """The scheduler's own idle gate, the one flush_cache trusts."""
    if hasattr(scheduler, "is_fully_idle"):
        return bool(scheduler.is_fully_idle())
    return bool(scheduler._is_no_request())  # releases before is_fully_idle


def is_paused(scheduler: Any) -> bool:
    return bool(getattr(scheduler, "_engine_paused", False))


def decode_ipc_frame(raw: bytes) -> Any:
    """Decode one tokenizer->scheduler frame for inspection (not consumption)."""
    import pickle

    io = importlib.import_module(IO_STRUCT_MODULE)
    if getattr(io, "_USE_PICKLE_IPC", True) is False and hasattr(io, "msgpack_decode"):
        obj = io.msgpack_decode(raw)
    else:
        obj = pickle.loads(raw)
    unwrap = getattr(io, "unwrap_from_pickle", None)
    if unwrap is not None and type(obj).__name__ == "PickleWrapper":
        obj = unwrap(obj)
    return obj


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
    except Exception:  # older releases keep them on the scheduler
        return (
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


def allocator_free_indices(allocator: Any) -> Optional[Any]:
    """Every free KV token index of the allocator as one tensor, or None when
    this allocator's free list is not readable."""
    import torch

    parts = [p for p in (getattr(allocator, "free_pages", None), getattr(allocator, "release_pages", None))
             if isinstance(p, torch.Tensor)]
    if not parts:
        return None
    pages = torch.cat(parts) if len(parts) > 1 else parts[0]
    page_size = int(getattr(allocator, "page_size", 1) or 1)
    if page_size == 1:
        return pages
    offsets = torch.arange(page_size, dtype=pages.dtype, device=pages.device)
    return (pages[:, None] * page_size + offsets[None, :]).reshape(-1)


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
