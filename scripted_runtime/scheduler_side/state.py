"""Complete, read-only views of scheduler state (runs in the scheduler process).

"Complete" is the point: a request can be held by ``running_batch``,
``last_batch``, ``chunked_req``, the overlap ``result_queue``, every PP
microbatch slot (``mbs``, ``last_mbs``, ``running_mbs``) and the
``waiting_queue``. SGLang's own upstream script context looks only at the
current slot; these views look at all of them.

Attribute names are those of 0.5.23; where older releases differ the getter
says so.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Tuple

from scripted_runtime.hooks import sglang_compat


class Holder(NamedTuple):
    """One place that holds requests. A named tuple, not a dataclass: the
    scan builds several per iteration on the scheduler's hot path."""

    label: str  # e.g. "running_batch", "mbs[2]", "result_queue[0]", "waiting_queue"
    batch: Any  # the ScheduleBatch, or None for chunked_req / waiting_queue
    reqs: Tuple[Any, ...]


def result_queue_batches(s: Any) -> List[Any]:
    """Launched batches whose results the overlap loop has not processed yet
    (``result_queue`` holds ``(batch_copy, result)`` pairs)."""
    return [entry[0] if isinstance(entry, tuple) else entry for entry in getattr(s, "result_queue", None) or ()]


PP_SLOT_LISTS = ("mbs", "last_mbs", "running_mbs")


def places(s: Any, pp_slots: Tuple[str, ...] = PP_SLOT_LISTS) -> Iterator[Tuple[str, Optional[int], Any, Any]]:
    """``(name, index, batch, reqs)`` of every place that can hold requests,
    in ``holders``' order (PP slot lists limited to ``pp_slots``); ``batch``
    is None for ``chunked_req`` and ``waiting_queue``. The one walk over
    scheduler state: ``holders``, ``find_req`` and the windows read it."""
    for name in ("running_batch", "last_batch"):
        batch = getattr(s, name, None)
        if batch is not None:
            yield name, None, batch, getattr(batch, "reqs", None) or ()
    chunked = getattr(s, "chunked_req", None)
    if chunked is not None:
        yield "chunked_req", None, None, (chunked,)
    for i, batch in enumerate(result_queue_batches(s)):
        yield "result_queue", i, batch, getattr(batch, "reqs", None) or ()
    for name in pp_slots:
        for i, batch in enumerate(getattr(s, name, None) or ()):
            if batch is not None:
                yield name, i, batch, getattr(batch, "reqs", None) or ()
    waiting = getattr(s, "waiting_queue", ()) or ()
    if waiting:
        yield "waiting_queue", None, None, waiting


_MODE_NAMES: Dict[int, Tuple[Any, Optional[str]]] = {}  # id(ForwardMode member) -> (member, lower-case name)


def batch_mode(batch: Any) -> Optional[str]:
    """A batch's forward mode as a lower-case name ("decode", "extend", ...),
    None where it has none. Read per holder and per forward after every
    iteration: an enum member's ``name`` is a slow descriptor, so each
    member's name is looked up once (the member is kept with it, so its id
    cannot be reused)."""
    mode = getattr(batch, "forward_mode", None)
    if mode is None:
        return None
    known = _MODE_NAMES.get(id(mode))
    if known is None or known[0] is not mode:
        name = getattr(mode, "name", None)
        known = _MODE_NAMES[id(mode)] = (mode, name.lower() if name else None)
    return known[1]


def place_label(name: str, index: Optional[int]) -> str:
    return name if index is None else f"{name}[{index}]"


def holders(s: Any) -> List[Holder]:
    return [Holder(place_label(name, i), batch, tuple(reqs)) for name, i, batch, reqs in places(s)]


def iter_reqs(s: Any) -> Iterator[Any]:
    seen = set()
    for holder in holders(s):
        for req in holder.reqs:
            if id(req) not in seen:
                seen.add(id(req))
                yield req


def find_req(s: Any, rid: str) -> Optional[Any]:
    """The held request with this rid (the first place ``holders`` lists).
    Read by a script's ``handle.finished`` every step, so it walks the
    places without building the holder list."""
    for _, _, _, reqs in places(s):
        for req in reqs:
            if req.rid == rid:
                return req
    return None


def holds(s: Any, req: Any) -> bool:
    """Whether any place holds this very Req object."""
    for _, _, _, reqs in places(s):
        for r in reqs:
            if r is req:
                return True
    return False


def where_is(s: Any, rid: str) -> List[str]:
    return [h.label for h in holders(s) if any(r.rid == rid for r in h.reqs)]


def live_reqs(s: Any) -> Dict[str, Any]:
    """Requests the scheduler still has work for (not finished)."""
    return {r.rid: r for r in iter_reqs(s) if not r.finished()}


def any_live(s: Any) -> bool:
    """Whether any held request is unfinished (``live_reqs`` without building it)."""
    return any(not r.finished() for r in iter_reqs(s))


def nothing_held(s: Any) -> bool:
    """No request anywhere, finished or not: the harness's complete idle scan."""
    return next(iter_reqs(s), None) is None


def is_chunking(s: Any, rid: str) -> bool:
    chunked = getattr(s, "chunked_req", None)
    return chunked is not None and chunked.rid == rid


def mbs_slots(s: Any) -> int:
    """PP microbatch slots (``pp_loop_size``); 0 outside PP."""
    return len(getattr(s, "mbs", None) or ())


def pp_slot(s: Any) -> Optional[int]:
    """The microbatch slot the PP loop is about to run (None outside PP)."""
    mbs = getattr(s, "mbs", None)
    if not mbs:
        return None
    running = getattr(s, "running_batch", None)
    for i, rb in enumerate(getattr(s, "running_mbs", ()) or ()):
        if rb is running:
            return i
    return None


# --- memory pools ------------------------------------------------------------


def req_pool_idx(req: Any) -> Optional[int]:
    """The request's req_to_token row (0.5.2x: req.kv.req_pool_idx; older: req.req_pool_idx)."""
    kv = getattr(req, "kv", None)
    if kv is not None and hasattr(kv, "req_pool_idx"):
        return kv.req_pool_idx
    return getattr(req, "req_pool_idx", None)


def kv_committed_len(req: Any) -> int:
    kv = getattr(req, "kv", None)  # 0.5.2x groups KV bookkeeping under req.kv
    if kv is not None and hasattr(kv, "kv_committed_len"):
        return kv.kv_committed_len
    return getattr(req, "kv_committed_len", 0)


def holds_kv(req: Any) -> bool:
    kv = getattr(req, "kv", None)
    if kv is not None and hasattr(kv, "holds_kv"):
        return bool(kv.holds_kv)
    return req_pool_idx(req) is not None


def kv_allocated_len(req: Any) -> int:
    kv = getattr(req, "kv", None)
    if kv is not None and hasattr(kv, "kv_allocated_len"):
        return kv.kv_allocated_len
    return getattr(req, "kv_allocated_len", kv_committed_len(req))


def engine_stats(s: Any) -> Dict[str, int]:
    stats = pool_stats(s)
    stats["tree_tokens"] = int(_call_or(s.tree_cache, "total_size", 0))
    return stats


def pool_stats(s: Any) -> Dict[str, int]:
    """``engine_stats`` less ``tree_tokens`` (which may walk the tree): what
    the invariants and the trace read after every iteration."""
    allocator = s.token_to_kv_pool_allocator
    tree = s.tree_cache
    pool = s.req_to_token_pool
    return {
        "kv_pool_free": int(allocator.available_size()),
        "kv_pool_total": int(getattr(allocator, "size", 0)),
        "req_pool_free": int(pool.available_size()),
        "req_pool_total": int(pool.size),
        "page_size": int(getattr(s, "page_size", 1)),
        "evictable": int(_call_or(tree, "evictable_size", 0)),
        "protected": int(_call_or(tree, "protected_size", 0)),
    }


def _call_or(obj: Any, name: str, default: Any) -> Any:
    fn = getattr(obj, name, None)
    if fn is None:
        return default
    try:
        value = fn()
    except Exception:  # noqa: BLE001 - a stat we cannot read is reported as default
        return default
    # unified radix caches (0.5.2x) report total_size as (full, other) tokens
    return value[0] if isinstance(value, tuple) else value


# --- one-line description, for error messages --------------------------------


def describe(s: Any) -> str:
    parts = [f"loop={sglang_compat.loop_kind(s)}"]
    if sglang_compat.is_paused(s):
        parts.append("PAUSED")
    slot = pp_slot(s)
    if slot is not None:
        parts.append(f"slot={slot}")
    for holder in holders(s):
        if not holder.reqs:
            continue
        rids = ",".join(
            f"{r.rid}{'*' if r.finished() else ''}" for r in holder.reqs[:6]
        )
        more = f"+{len(holder.reqs) - 6}" if len(holder.reqs) > 6 else ""
        mode = batch_mode(holder.batch)
        parts.append(f"{holder.label}{'(' + mode + ')' if mode else ''}=[{rids}{more}]")
    stats = engine_stats(s)
    parts.append(f"kv_free={stats['kv_pool_free']}/{stats['kv_pool_total']}")
    parts.append(f"rows_free={stats['req_pool_free']}/{stats['req_pool_total']}")
    parts.append(f"fully_idle={sglang_compat.is_fully_idle(s)}")
    return " ".join(parts)
