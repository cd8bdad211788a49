"""Mutants of the pools a request holds: its ``req_to_token`` row (freed on
abort, kept between chunks) and its KV slots (the allocator's free path, an
abort's release)."""
from __future__ import annotations

from typing import Any

from scripted_runtime.hooks.mutants.base import (ALL, BATCH_RESULT_PROCESSOR, MEMORY_POOL, SCHEDULE_BATCH,
                                                 TOKEN_ALLOCATOR, mutant, find_attr, find_method, find_module, replace_attr,
                                                 scheduler_class)


# --- abort: the row is not freed --------------------------------------------------


@mutant("mut_abort_keeps_row", topologies=ALL,
        summary="an aborted request's req_to_token row is forgotten, never freed",
        expected="crash (SGLang's own idle req-pool leak check), else end-state check (rows not all free)")
def _install_mut_abort_keeps_row(scheduler_module: Any) -> None:
    """``ReqToTokenPool.free(req)`` of an aborted request (``finished_reason``
    is ``FINISH_ABORT``) forgets the row (``req_pool_idx = None``) without
    putting it back on ``free_slots``: every abort of a request holding a row
    (running, chunked, or in flight) leaks one req_to_token row.

    Plausible: an abort-specific release path that "detaches" the request
    from its row instead of freeing it (the streaming-session path does
    detach rows on purpose, through ``claim_kv_row``).

    Seen by: crash, most likely first: SGLang's own idle check
    (``_check_req_pool``, strict by default) raises at the first idle
    iteration after the abort; else the end-state pools check (req_to_token
    rows not all free). No per-iteration invariant sees a row that no request
    holds and that is not on the free list. All topologies."""
    mutant = "mut_abort_keeps_row"
    scheduler_class(scheduler_module, mutant)
    pool_cls = find_attr(find_module(MEMORY_POOL, mutant), "ReqToTokenPool", mutant,
                     f"{MEMORY_POOL}.ReqToTokenPool")
    original = find_method(pool_cls, "free", mutant, ("req",))
    finish_abort = find_attr(find_module(SCHEDULE_BATCH, mutant), "FINISH_ABORT", mutant, f"{SCHEDULE_BATCH}.FINISH_ABORT")

    def free(self, req):
        if isinstance(getattr(req, "finished_reason", None), finish_abort) and req.kv.holds_kv:
            req.kv.req_pool_idx = None  # MUTANT: the row is forgotten, never back on free_slots
            return
        original(self, req)

    replace_attr(pool_cls, "free", free, original)


# --- abort: KV freed twice --------------------------------------------------------


@mutant("mut_abort_double_free_kv", topologies=ALL,
        summary="a decoding request finished by abort has its KV freed twice",
        expected="invariant pool_accounting")
def _install_mut_abort_double_free_kv(scheduler_module: Any) -> None:
    """When a decoding request finishes by abort (``to_finish`` set by
    ``abort_request``, turned into ``FINISH_ABORT`` by the decode result),
    its own KV (``req_to_token[row, cache_protected_len:kv_allocated_len]``
    as it was before the release) goes back to the allocator twice: once
    through ``release_kv_cache`` and once more right after.

    Plausible: an abort path that frees the request's KV itself and then also
    calls the common release (which frees the same range, or inserts it into
    the tree and frees the duplicates). Wraps
    ``SchedulerBatchResultProcessor._handle_finish_state_updated_req``.

    Seen by: invariant pool_accounting at the next iteration (available +
    evictable + protected + uncached > total: the same indices are free and
    cached/free again); later the allocator hands one index to two requests.
    Only aborts of decoding requests (prefill and chunked aborts take other
    paths). All topologies."""
    mutant = "mut_abort_double_free_kv"
    scheduler_class(scheduler_module, mutant)
    proc_cls = find_attr(find_module(BATCH_RESULT_PROCESSOR, mutant), "SchedulerBatchResultProcessor", mutant,
                     f"{BATCH_RESULT_PROCESSOR}.SchedulerBatchResultProcessor")
    original = find_method(proc_cls, "_handle_finish_state_updated_req", mutant, ("req", "batch", "result", "i"))
    finish_abort = find_attr(find_module(SCHEDULE_BATCH, mutant), "FINISH_ABORT", mutant, f"{SCHEDULE_BATCH}.FINISH_ABORT")

    def _handle_finish_state_updated_req(self, req, batch, result, i, *args, **kwargs):
        again = None
        kv = req.kv
        if (req.beam_group is None and isinstance(req.finished_reason, finish_abort) and kv.holds_kv
                and kv.kv_allocated_len > kv.cache_protected_len):
            row = self.req_to_token_pool.req_to_token[kv.req_pool_idx]
            again = row[kv.cache_protected_len:kv.kv_allocated_len].clone()
        original(self, req, batch, result, i, *args, **kwargs)
        if again is not None and not req.kv.holds_kv:
            self.token_to_kv_pool_allocator.free(again)  # MUTANT: freed a second time

    replace_attr(proc_cls, "_handle_finish_state_updated_req", _handle_finish_state_updated_req, original)


# --- a chunked request's row between chunks ---------------------------------------


@mutant("mut_chunk_alloc_ignores_held_row", topologies=ALL,
        summary="a chunked request's later chunk takes a fresh req_to_token row; the old one leaks",
        expected="invariant slot_ownership (row moved between chunks)")
def _install_mut_chunk_alloc_ignores_held_row(scheduler_module: Any) -> None:
    """``ReqToTokenPool.alloc(reqs)`` no longer sees that a request already
    holds a row: a chunked request's later chunk takes a fresh row (its prefix
    copied over by ``alloc_for_extend``, read before the alloc) and its old
    row is never freed.

    Plausible: the "reuse the held row" test of PR 17850 lost in a refactor
    of alloc (e.g. ``reusing`` computed after the binding loop). Unlike the
    pr17850 toggle (the old row goes back to the free list, a reuse hazard)
    this one leaks the old row.

    Seen by: invariant slot_ownership ("chunked request moved from row A to
    row B between chunks") at the iteration after its second chunk is
    scheduled; the leaked rows would later trip SGLang's own idle req-pool
    check (crash) or the end-state pools check. Needs a prompt longer than
    one chunk (64 tokens). All topologies."""
    mutant = "mut_chunk_alloc_ignores_held_row"
    scheduler_class(scheduler_module, mutant)
    pool_cls = find_attr(find_module(MEMORY_POOL, mutant), "ReqToTokenPool", mutant,
                     f"{MEMORY_POOL}.ReqToTokenPool")
    original = find_method(pool_cls, "alloc", mutant, ("reqs",))

    def alloc(self, reqs):
        for r in reqs:
            if r.kv.holds_kv and getattr(r, "session", None) is None:
                r.kv.req_pool_idx = None  # MUTANT: the held row is not seen (and never freed)
        return original(self, reqs)

    replace_attr(pool_cls, "alloc", alloc, original)


# --- the KV allocator's free path -------------------------------------------------


@mutant("mut_kv_free_drops_last_index", topologies=ALL,
        summary="the KV allocator's free drops the last index of a multi-index free (a slot leaks)",
        expected="invariant pool_accounting")
def _install_mut_kv_free_drops_last_index(scheduler_module: Any) -> None:
    """``TokenToKVPoolAllocator.free`` (page size 1, the CPU configuration)
    drops the last index of every free of two or more indices (an
    off-by-one: ``free_index[:-1]``): one KV slot leaks per such free.
    Single-index frees (a decode step's overallocation) are intact, so the
    warm-up request leaks nothing. Applied where the indices really go back
    (not when a free group only collects them; the group's final free is
    one free).

    Plausible: an off-by-one in a range computation on the free path (an
    exclusive end taken as inclusive, ``[start, end - 1)``). Multi-index
    frees come from a release of uncached KV (abort, retract, a finished
    request whose tail was not inserted), the tree's eviction, and an insert
    that finds its prefix already cached (two requests sharing a prompt
    prefix computed concurrently).

    Seen by: invariant pool_accounting at the next iteration (available +
    evictable + protected + uncached < total); SGLang's own idle leak check
    (crash) and the end-state pools check later. All topologies."""
    mutant = "mut_kv_free_drops_last_index"
    scheduler_class(scheduler_module, mutant)
    alloc_cls = find_attr(find_module(TOKEN_ALLOCATOR, mutant), "TokenToKVPoolAllocator", mutant,
                      f"{TOKEN_ALLOCATOR}.TokenToKVPoolAllocator")
    original = find_method(alloc_cls, "free", mutant, ("free_index",))

    def free(self, free_index):
        if getattr(self, "free_group", None) is None and free_index.numel() > 1:
            free_index = free_index[:-1]  # MUTANT: off by one, the last index is never freed
        return original(self, free_index)

    replace_attr(alloc_cls, "free", free, original)
