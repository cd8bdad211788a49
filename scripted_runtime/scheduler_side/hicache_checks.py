"""HiCache checks, run every iteration with the invariants (scheduler
process); each is a no-op when HiCache is off. Each is a check
``check(view, mem) -> Optional[Violation]`` like the invariants, registered
in ``check_registry`` (group ``hicache``) by ``@hicache_check``, which runs
it only when HiCache is on.

What they hold SGLang to, in its own words (0.5.23):

* ``hicache_load_before_read``: a forward reads a load-back's KV only after
  the load wrote it. SGLang orders this with the layer events of
  ``LayerDoneCounter``: ``get_key_buffer`` "is hooked with synchronization
  for layer-wise KV cache loading" and the batch that uses a load carries
  its producer index (``hicache_consumer_index``). With the transfer gate
  (``hooks/hicache_gate.py``) holding loads, a forward that reads slots of a
  load which has copied nothing, without waiting on it, is this violation
  (PR 19177's race: a CUDA-graph replay does not run that wait).
* ``hicache_transfer_slots``: no device KV slot of a transfer SGLang has not
  reaped yet is free. "A copy's source and target are not free pages until
  its finish event is observed, so allocation never reuses them"
  (``allocator/unified_sub_pool.py``); a flush, eviction or abort that frees
  them lets a new request's KV be overwritten by a late load, or backed up
  in another's place.
* ``hicache_host_accounting``: the host pool adds up. Every host slot a tree
  node holds is allocated, no two nodes share one, and every allocated host
  slot is held by a node (no leak): ``host used == tree host slots``.
  Skipped with an L3 storage backend, whose prefetch buffers hold host
  slots outside the tree.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

from scripted_runtime.hooks import hicache_gate
from scripted_runtime.scheduler_side import check_registry, hicache_state
from scripted_runtime.scheduler_side.check_registry import Violation


def active(s: Any) -> bool:
    """Whether HiCache is on in this scheduler (the checks cost nothing otherwise)."""
    return hicache_state.controller(s) is not None


def hicache_check(name: str, *, doc: str):
    """Register ``check(view, mem)`` as the HiCache check ``name``, run only
    when HiCache is on (the function itself stays callable as written)."""

    def add(check: Callable[[Any, Any], Optional[Violation]]) -> Callable[[Any, Any], Optional[Violation]]:
        @functools.wraps(check)
        def run(view: Any, mem: Any) -> Optional[Violation]:
            return check(view, mem) if active(view.s) else None

        check_registry.invariant(name, doc=doc, group="hicache")(run)
        return check

    return add


@hicache_check("hicache_load_before_read", doc="no forward reads KV slots of a load-back that has copied nothing "
                                               "yet, without waiting on it")
def check_load_before_read(v: Any, mem: Any) -> Optional[Violation]:
    gate = hicache_gate.gate()
    if not gate.unwaited_reads:
        return None
    read = gate.unwaited_reads[0]
    more = len(gate.unwaited_reads) - 1
    gate.unwaited_reads.clear()
    return Violation("hicache_load_before_read",
                     f"the {read['mode']} forward read {read['n_slots']} KV slot(s) {read['slots']} of request "
                     f"{read['rid']} that load #{read['transfer']} (held, nothing copied yet) still writes, without "
                     f"waiting on it (batch hicache_consumer_index={read['consumer_index']})"
                     + (f"; {more} more such read(s)" if more > 0 else ""))


@hicache_check("hicache_transfer_slots", doc="no device KV slot of a copy SGLang has not reaped yet is free")
def check_transfer_slots(v: Any, mem: Any) -> Optional[Violation]:
    s = v.s
    gate = hicache_gate.gate()
    if not gate.transfers:
        return None
    queued = hicache_state.ack_events(s)
    gate.forget_reaped(lambda t: id(getattr(t.completion, "finish_event", None)) in queued)
    if not gate.transfers:
        return None
    counts = mem.free_kv_counts(s)
    if counts is None:
        return None
    for t in gate.transfers:
        idx = t.device_indices
        if idx.numel() == 0:
            continue
        idx = idx.numpy()
        idx = idx[idx < len(counts)]
        free = idx[counts.take(idx) > 0]
        if free.size:
            writes = "writes" if t.kind == "load" else "reads"
            return Violation("hicache_transfer_slots",
                             f"{free.size} device KV slot(s) {free[:6].tolist()} that {t.kind} #{t.seq} ({t.state}, "
                             f"{t.device_indices.numel()} tokens, not reaped by SGLang) {writes} are in the "
                             f"allocator's free list")
    return None


@hicache_check("hicache_host_accounting", doc="every host slot a tree node holds is allocated, to one node, "
                                              "and no allocated one is unheld")
def check_host_accounting(v: Any, mem: Any) -> Optional[Violation]:
    s = v.s
    host = hicache_state.host_pool(s)
    if host is None or hicache_state.storage_enabled(s):
        return None
    used_mask = getattr(host, "slot_used", None)
    if used_mask is None:
        return None
    import numpy as np  # numpy, not torch: a few small-array torch ops cost more than this whole check

    used = used_mask.numpy()
    held = hicache_state.tree_host_slots(s)
    if held.size:
        not_used = held[~used[held]]
        if not_used.size:
            return Violation("hicache_host_accounting",
                             f"host slot(s) {np.unique(not_used)[:6].tolist()} held by tree nodes are free in the "
                             f"host pool ({not_used.size} in all): a later load-back would read whatever is written "
                             f"there next")
        mark = np.zeros(used.size, dtype=bool)
        mark[held] = True
        distinct = int(np.count_nonzero(mark))
        if distinct != held.size:
            return Violation("hicache_host_accounting",
                             f"{held.size - distinct} host slot(s) are held by two tree nodes")
    n_used = int(np.count_nonzero(used))
    if n_used != held.size:
        return Violation("hicache_host_accounting",
                         f"host pool: {n_used} slots allocated but the tree holds {held.size} "
                         f"({n_used - held.size:+d}: " + ("leaked" if n_used > held.size else "missing") + ")")
    return None


NAMES = check_registry.names("hicache")
