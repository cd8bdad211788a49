"""Mutants: plausible bugs planted in SGLang's scheduler path in-process, to
measure which the harness's checks catch (``scripted-runtime mutate``).

Each mutant is a ``Patch`` whose ``install`` receives the imported
``sglang.srt.managers.scheduler`` module and monkeypatches one place of the
0.5.23 scheduler path: a one-line or few-line change a real PR could make.
Replacements keep ``__wrapped__`` (the attribute they replaced); a target
that is missing, or a copied method body that no longer matches the source it
was copied from, raises ``PatchError`` ("... written against 0.5.23").

Every mutant leaves the server's warm-up request (one short prompt, run to
its length, no abort, pause, flush or chunking) untouched, so the server
starts; each bug needs an interleaving the explorer generates: an abort, a
pause, a flush, an update_weights, a chunked prompt, several requests.

``expected`` names the check that should see the bug, in the words of
``scripted_runtime.user_side.mutate.caught_by``: ``invariant NAME``
(idle_gate, slot_ownership, radix_locks, pool_accounting, checked after every
iteration), ``end-state check`` (every request finishes or is aborted, the
engine goes idle, rows all free, KV free or evictable, no tree lock held),
``crash`` (SGLang's own asserts, or its idle leak check, which is strict by
default: SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE), or ``none today`` where
no check looks at what the bug breaks: a surviving mutant is a finding.
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import sys
import textwrap
from collections import deque
from typing import Any, Callable, Dict

from scripted_runtime.hooks.patch_base import Patch, PatchError

RELEASE = "0.5.23"

# The SGLang modules the mutants patch besides the scheduler module (imported
# by each install that needs them; listed for tools that snapshot them).
SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch"
MEMORY_POOL = "sglang.srt.mem_cache.memory_pool"
TOKEN_ALLOCATOR = "sglang.srt.mem_cache.allocator.token"
UNIFIED_RADIX_CACHE = "sglang.srt.mem_cache.unified_radix_cache"
MEM_CACHE_COMMON = "sglang.srt.mem_cache.common"
BATCH_RESULT_PROCESSOR = "sglang.srt.managers.scheduler_components.batch_result_processor"
WEIGHT_UPDATER = "sglang.srt.managers.scheduler_components.weight_updater"
TP_WORKER = "sglang.srt.managers.tp_worker"
FULL_COMPONENT = "sglang.srt.mem_cache.unified_cache.components.full"
PATCHED_MODULES = (SCHEDULE_BATCH, MEMORY_POOL, TOKEN_ALLOCATOR, UNIFIED_RADIX_CACHE, MEM_CACHE_COMMON,
                   BATCH_RESULT_PROCESSOR, WEIGHT_UPDATER, TP_WORKER, FULL_COMPONENT)

# Digests of the 0.5.23 method bodies that two mutants copy (normalized
# source: dedented, blank lines dropped, trailing space stripped).
EVENT_LOOP_NORMAL_DIGEST = "1ff5012fa2b18867"
EVENT_LOOP_OVERLAP_DIGEST = "b3cbd1f2e07e5466"


# --- helpers -----------------------------------------------------------------

_NOTHING = object()


def _missing(mutant: str, what: str) -> PatchError:
    return PatchError(f"mutant {mutant}: {what} not found: this mutant is written against SGLang {RELEASE}")


def _attr(owner: Any, name: str, mutant: str, what: str) -> Any:
    value = getattr(owner, name, None) if owner is not None else None
    if value is None:
        raise _missing(mutant, what)
    return value


def _module(name: str, mutant: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise _missing(mutant, f"module {name} ({exc})") from exc


def _scheduler_cls(scheduler_module: Any, mutant: str) -> type:
    return _attr(scheduler_module, "Scheduler", mutant, "sglang.srt.managers.scheduler.Scheduler")


def _method(cls: type, name: str, mutant: str, params: tuple = ()) -> Callable:
    """``cls.name``, checked to take ``params`` (by name, after self)."""
    fn = _attr(cls, name, mutant, f"{cls.__name__}.{name}")
    if params:
        try:
            have = list(inspect.signature(inspect.unwrap(fn)).parameters)
        except (TypeError, ValueError):
            have = []
        if any(p not in have for p in params):
            raise _missing(mutant, f"{cls.__name__}.{name}({', '.join(params)}) (found ({', '.join(have)}))")
    return fn


def _replace(owner: Any, name: str, new: Callable, original: Callable) -> None:
    new.__wrapped__ = original
    setattr(owner, name, new)


def source_digest(fn: Callable) -> str:
    """Digest of a function's normalized source (its innermost ``__wrapped__``)."""
    src = textwrap.dedent(inspect.getsource(fn))
    norm = "\n".join(line.rstrip() for line in src.splitlines() if line.strip())
    return hashlib.sha256(norm.encode()).hexdigest()[:16]


def _check_copied_body(fn: Callable, digest: str, mutant: str, what: str) -> None:
    try:
        found = source_digest(fn)
    except (OSError, TypeError) as exc:
        raise _missing(mutant, f"the source of {what} ({exc})") from exc
    if found != digest:
        raise PatchError(f"mutant {mutant}: {what} differs from the {RELEASE} body this mutant copies "
                         f"(source digest {found}, expected {digest}): it is written against SGLang {RELEASE}")


def _keep_crash_reporting(scheduler_cls: type, loop: Callable) -> Callable:
    """A replaced event loop keeps the harness's crash reporting (the hook
    wraps the loops at import, before patches are installed)."""
    if not getattr(scheduler_cls, "_scripted_runtime_installed", False):
        return loop
    from scripted_runtime.hooks import scheduler_hook

    return scheduler_hook.report_crashes(loop)


# --- 1. the PP drain check -----------------------------------------------------


def _install_mut_pp_drain_first_slot_only(scheduler_module: Any) -> None:
    """``Scheduler._pp_microbatches_drained`` looks at microbatch slot 0 only
    (``running_mbs[0]`` and ``mbs[0]``) instead of every slot.

    Plausible: a refactor that indexes "the" microbatch with a stale index, or
    reads the per-slot lists as if pp_loop_size were 1; unlike the pr27446
    toggle (which ignores ``mbs`` altogether) this one still sees an extend in
    flight, but only in slot 0.

    Seen by: invariant idle_gate, at the first iteration where a live request
    sits in a slot other than 0 while the current slot's running/last batch,
    ``chunked_req`` and the waiting queue are empty (a single request at pp=4
    does that within a few iterations); a flush accepted then would also trip
    radix_locks/slot_ownership. pp4 only (pp=1 has no microbatch slots)."""
    mutant = "mut_pp_drain_first_slot_only"
    cls = _scheduler_cls(scheduler_module, mutant)
    original = _method(cls, "_pp_microbatches_drained", mutant)
    get_parallel = _attr(scheduler_module, "get_parallel", mutant, "sglang.srt.managers.scheduler.get_parallel")

    def _pp_microbatches_drained(self) -> bool:
        if get_parallel().pp_size == 1:
            return True
        first = self.mbs[0]
        return self.running_mbs[0].is_empty() and (first is None or first.is_empty())  # MUTANT: slot 0 only

    _replace(cls, "_pp_microbatches_drained", _pp_microbatches_drained, original)


# --- 2. the pause check of the normal loop ------------------------------------


def _install_mut_normal_loop_ignores_pause(scheduler_module: Any) -> None:
    """``Scheduler.event_loop_normal`` no longer stops at ``_engine_paused``:
    a paused engine keeps scheduling and running batches (the overlap and PP
    loops are untouched).

    Plausible: the pause check sits in each loop separately; a refactor of
    the normal loop (or a new loop variant copied from an older one) drops it.
    The body is copied from 0.5.23 (checked by source digest) minus the
    ``if self._engine_paused: ...; continue`` lines.

    Seen by: the ``pause`` contract, the iteration a forward is launched
    while paused (before the contracts existed nothing saw it: the baseline
    kill table's survivor). pp1-normal only."""
    mutant = "mut_normal_loop_ignores_pause"
    cls = _scheduler_cls(scheduler_module, mutant)
    original = _method(cls, "event_loop_normal", mutant)
    _check_copied_body(original, EVENT_LOOP_NORMAL_DIGEST, mutant, "Scheduler.event_loop_normal")
    grad_mode = _attr(scheduler_module, "DynamicGradMode", mutant, "sglang.srt.managers.scheduler.DynamicGradMode")
    envs = _attr(scheduler_module, "envs", mutant, "sglang.srt.managers.scheduler.envs")

    @grad_mode()
    def event_loop_normal(self):
        """A normal scheduler loop."""
        while True:
            if self.gracefully_exit:
                break

            # Receive requests
            self.ingest_requests()
            # MUTANT: `if self._engine_paused: self._record_scheduler_state_for_paused_engine(); continue`
            # is gone.

            # Get the next batch to run
            plan = self.get_next_batch_to_run(
                running_batch=self.running_batch, last_batch=self.last_batch
            )
            self.running_batch = plan.running_batch
            batch = plan.batch_to_run
            self.cur_batch_for_debug = batch

            # Launch the current batch
            if batch:
                result = self.run_batch(batch)
                self.process_batch_result(batch, result)
            else:
                # When the server is idle, do self-check and re-init some states.
                self._sched_idled = True
                self.on_idle()

            # Update last_batch
            self.last_batch = batch
            if envs.SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY.get():
                self.invariant_checker.self_check_during_busy()

    _replace(cls, "event_loop_normal", _keep_crash_reporting(cls, event_loop_normal), original)


# --- 3. retract in pause_generation -------------------------------------------


def _install_mut_pause_retract_forgets_last_batch(scheduler_module: Any) -> None:
    """``Scheduler.pause_generation(mode="retract")`` retracts the running
    batch and the chunked request but not the requests of the prefill batch
    that just ran (``last_batch``, not merged into ``running_batch`` yet);
    it still sets ``last_batch = None``, so those requests are held nowhere,
    with their row, their KV and their tree lock.

    Plausible: a refactor drops the "also retract last_batch's requests"
    block (the code around it was touched by several fixes: DP attention's
    converted batch, disaggregated prefill). Done by a wrapper: it processes
    the in-flight overlap result exactly as 0.5.23 does first, clears
    ``last_batch``, then calls the original, which then skips that block.

    Seen by: after its prefill the lost request's prompt KV is in the tree,
    locked by its lock, and it has no uncached KV, so the busy accounting
    still balances and the harness counts the request as finished (it ran a
    batch and is held nowhere). If it was the only request, the paused
    engine is idle at once: invariant radix_locks (a node still locked at
    idle; pool_accounting's idle form too). Otherwise, once the others
    finish: crash, SGLang's own idle req-pool leak check (its row was never
    freed), else the end-state pools check. pp1 loops only: at pp4
    ``last_mbs`` still holds the batch, which is merged on its slot's next
    turn, so nothing is lost."""
    mutant = "mut_pause_retract_forgets_last_batch"
    cls = _scheduler_cls(scheduler_module, mutant)
    original = _method(cls, "pause_generation", mutant, ("recv_req",))
    _method(cls, "process_batch_result", mutant)
    null_mode = getattr(getattr(scheduler_module, "DisaggregationMode", None), "NULL", None)
    if null_mode is None:
        raise _missing(mutant, "sglang.srt.managers.scheduler.DisaggregationMode.NULL")

    def pause_generation(self, recv_req):
        last = self.last_batch
        if (
            getattr(recv_req, "mode", None) == "retract"
            and last is not None
            and self.disaggregation_mode == null_mode
            and last.forward_mode.is_extend()
            and last is not self.running_batch
        ):
            if self.enable_overlap:  # as 0.5.23 does first (`if self.enable_overlap and self.last_batch:`)
                tmp_batch, tmp_result = self.result_queue.popleft()
                self.process_batch_result(tmp_batch, tmp_result)
            self.last_batch = None  # MUTANT: last_batch's requests are never added to retract_reqs
        return original(self, recv_req)

    _replace(cls, "pause_generation", pause_generation, original)


# --- 4. abort: the row is not freed --------------------------------------------


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
    _scheduler_cls(scheduler_module, mutant)
    pool_cls = _attr(_module(MEMORY_POOL, mutant), "ReqToTokenPool", mutant,
                     f"{MEMORY_POOL}.ReqToTokenPool")
    original = _method(pool_cls, "free", mutant, ("req",))
    finish_abort = _attr(_module(SCHEDULE_BATCH, mutant), "FINISH_ABORT", mutant, f"{SCHEDULE_BATCH}.FINISH_ABORT")

    def free(self, req):
        if isinstance(getattr(req, "finished_reason", None), finish_abort) and req.kv.holds_kv:
            req.kv.req_pool_idx = None  # MUTANT: the row is forgotten, never back on free_slots
            return
        original(self, req)

    _replace(pool_cls, "free", free, original)


# --- 5. abort: KV freed twice ---------------------------------------------------


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
    _scheduler_cls(scheduler_module, mutant)
    proc_cls = _attr(_module(BATCH_RESULT_PROCESSOR, mutant), "SchedulerBatchResultProcessor", mutant,
                     f"{BATCH_RESULT_PROCESSOR}.SchedulerBatchResultProcessor")
    original = _method(proc_cls, "_handle_finish_state_updated_req", mutant, ("req", "batch", "result", "i"))
    finish_abort = _attr(_module(SCHEDULE_BATCH, mutant), "FINISH_ABORT", mutant, f"{SCHEDULE_BATCH}.FINISH_ABORT")

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

    _replace(proc_cls, "_handle_finish_state_updated_req", _handle_finish_state_updated_req, original)


# --- 6. radix lock refs: the checkpoint does not unlock the old node -------------


def _install_mut_checkpoint_keeps_old_lock(scheduler_module: Any) -> None:
    """``UnifiedRadixCache.checkpoint_into_tree`` takes the lock on the node
    its insert ended on but no longer releases the request's previous lock
    (the ``dec_lock_ref`` of ``self.unlock(req.lock)`` is skipped): every
    checkpoint of a request whose lock is on a non-root node leaks one lock
    ref on that path. That is the finish of a request that matched a cached
    prefix, and every chunk after the first of a chunked prompt (0.5.23's
    form of cache_unfinished_req / cache_finished_req).

    Plausible: the lock move is "unlock old, lock new"; a change that
    reorders or conditions it (e.g. only unlock when the node changed, with
    the wrong comparison) drops the first half. A request whose lock is on
    the root (no prefix hit: the warm-up request) leaks nothing visible.

    Seen by: invariant radix_locks at the first idle iteration ("idle, yet N
    tree node(s) still locked"), and the end-state check (tree tokens still
    protected). SGLang's own idle check counts protected tokens as accounted,
    so it stays silent. All topologies."""
    mutant = "mut_checkpoint_keeps_old_lock"
    _scheduler_cls(scheduler_module, mutant)
    cache_cls = _attr(_module(UNIFIED_RADIX_CACHE, mutant), "UnifiedRadixCache", mutant,
                      f"{UNIFIED_RADIX_CACHE}.UnifiedRadixCache")
    original = _method(cache_cls, "checkpoint_into_tree", mutant, ("req", "up_to"))
    _method(cache_cls, "unlock", mutant)

    def checkpoint_into_tree(self, req, *, up_to, **kwargs):
        old = req.lock
        req.lock = None  # MUTANT: the insert's `self.unlock(req.lock)` now releases nothing
        try:
            return original(self, req, up_to=up_to, **kwargs)
        finally:
            if req.lock is None:  # an early return moved no lock: the request keeps its own
                req.lock = old

    _replace(cache_cls, "checkpoint_into_tree", checkpoint_into_tree, original)


# --- 7. radix lock refs: a release without checkpoint keeps the lock -------------


def _install_mut_release_without_checkpoint_keeps_lock(scheduler_module: Any) -> None:
    """``release_kv_cache(req, tree_cache, checkpoint=False)`` frees the row
    and the uncached KV but no longer unlocks the request's tree node: the
    unlock moved into the checkpoint branch. Hit by every release that does
    not insert into the tree: a retract (pause_generation retract, decode
    out of memory), a chunked request's abort, a discarded output.

    Plausible: ``checkpoint`` re-anchors the lock on the inserted node, so a
    refactor that "keeps lock handling next to the insert" unlocks only after
    a checkpoint. Done by patching the function where the scheduler modules
    imported it (``mem_cache.common.release_kv_cache`` and every module
    holding that name).

    Seen by: invariant radix_locks at the first idle iteration after such a
    release of a request locked on a non-root node (a cached-prefix hit, or a
    chunked prompt past its first chunk), and the end-state check (tree
    tokens still protected). All topologies."""
    mutant = "mut_release_without_checkpoint_keeps_lock"
    _scheduler_cls(scheduler_module, mutant)
    common = _module(MEM_CACHE_COMMON, mutant)
    original = _attr(common, "release_kv_cache", mutant, f"{MEM_CACHE_COMMON}.release_kv_cache")
    if "checkpoint" not in inspect.signature(original).parameters:
        raise _missing(mutant, f"{MEM_CACHE_COMMON}.release_kv_cache(req, tree_cache, *, checkpoint)")

    def release_kv_cache(req, tree_cache, *, checkpoint):
        if req.kv.holds_kv and not (checkpoint and not req.skip_radix_cache_insert):
            req.lock = None  # MUTANT: only the checkpoint branch unlocks; this lock is never released
        return original(req, tree_cache, checkpoint=checkpoint)

    release_kv_cache.__wrapped__ = original
    holders = [mod for name, mod in list(sys.modules.items())
               if name.startswith("sglang.") and getattr(mod, "release_kv_cache", None) is original]
    if scheduler_module not in holders or common not in holders:
        raise _missing(mutant, "release_kv_cache imported by sglang.srt.managers.scheduler")
    for mod in holders:
        setattr(mod, "release_kv_cache", release_kv_cache)


# --- 8. a chunked request's row between chunks -----------------------------------


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
    _scheduler_cls(scheduler_module, mutant)
    pool_cls = _attr(_module(MEMORY_POOL, mutant), "ReqToTokenPool", mutant,
                     f"{MEMORY_POOL}.ReqToTokenPool")
    original = _method(pool_cls, "alloc", mutant, ("reqs",))

    def alloc(self, reqs):
        for r in reqs:
            if r.kv.holds_kv and getattr(r, "session", None) is None:
                r.kv.req_pool_idx = None  # MUTANT: the held row is not seen (and never freed)
        return original(self, reqs)

    _replace(pool_cls, "alloc", alloc, original)


# --- 9. pruning of finished requests ---------------------------------------------


def _install_mut_prune_keeps_aborted(scheduler_module: Any) -> None:
    """``ScheduleBatch.filter_batch`` (no ``keep_indices`` given) prunes
    requests that finished naturally but keeps those finished by abort
    (``FINISH_ABORT``): an aborted request stays in the running batch after
    its KV and row were released, and is decoded again every step on a row
    it no longer owns.

    Plausible: a prune test rewritten on the finish reason ("drop requests
    that reached their length or a stop") that forgets abort, or an abort
    kept "one more step" to stream its message.

    Seen by: pp1-normal and pp4: crash in the same iteration (the decode
    result reaches the released request again; ``release_kv_cache`` asserts
    that a request without a row has released its KV, and the extra decode
    step just counted one more token for it). pp1-overlap skips finished
    requests when it processes results, so there the extra steps only
    allocate KV that no held request accounts for: invariant
    pool_accounting; at the latest the end-state check (never idle). All
    topologies."""
    mutant = "mut_prune_keeps_aborted"
    _scheduler_cls(scheduler_module, mutant)
    sb = _module(SCHEDULE_BATCH, mutant)
    batch_cls = _attr(sb, "ScheduleBatch", mutant, f"{SCHEDULE_BATCH}.ScheduleBatch")
    req_cls = _attr(sb, "Req", mutant, f"{SCHEDULE_BATCH}.Req")
    finish_abort = _attr(sb, "FINISH_ABORT", mutant, f"{SCHEDULE_BATCH}.FINISH_ABORT")
    original = _method(batch_cls, "filter_batch", mutant, ("reqs_to_exclude", "keep_indices"))

    def filter_batch(self, reqs_to_exclude=None, keep_indices=None):
        if keep_indices is None and any(isinstance(r.finished_reason, finish_abort) for r in self.reqs):
            if isinstance(reqs_to_exclude, req_cls):
                reqs_to_exclude = [reqs_to_exclude]
            exclude = reqs_to_exclude or []
            keep_indices = [
                i for i, r in enumerate(self.reqs)
                # MUTANT: `not r.finished()` became "not finished, or aborted"
                if (not r.finished() or isinstance(r.finished_reason, finish_abort)) and r not in exclude
            ]
        return original(self, reqs_to_exclude=reqs_to_exclude, keep_indices=keep_indices)

    _replace(batch_cls, "filter_batch", filter_batch, original)


# --- 10. the idle gate ----------------------------------------------------------


def _install_mut_idle_gate_ignores_last_batch(scheduler_module: Any) -> None:
    """``Scheduler.is_fully_idle`` drops its ``last_batch`` term: a prefill
    batch that just ran, whose requests are not merged into
    ``running_batch`` yet, no longer counts as work, so the gate (what
    ``flush_cache`` trusts) says idle with live requests in it.

    Plausible: a cleanup of the gate's long conjunction ("last_batch is
    merged into running_batch anyway") that misses the one iteration where
    it is not. Done by a wrapper that hides ``last_batch`` from the original
    for the duration of the call.

    Seen by: invariant idle_gate at the iteration after any prefill that
    leaves nothing else running or waiting (pp1-normal; a flush accepted then
    resets the tree under the request). In the overlap loop ``result_queue``
    holds the same batch and at pp4 the ``mbs`` slot does, so the bug is
    invisible there. pp1-normal."""
    mutant = "mut_idle_gate_ignores_last_batch"
    cls = _scheduler_cls(scheduler_module, mutant)
    original = _method(cls, "is_fully_idle", mutant, ("for_health_check", "ignore_waiting"))

    def is_fully_idle(self, for_health_check=False, ignore_waiting=False) -> bool:
        last = self.last_batch
        self.last_batch = None  # MUTANT: `(self.last_batch is None or self.last_batch.is_empty())` dropped
        try:
            return original(self, for_health_check=for_health_check, ignore_waiting=ignore_waiting)
        finally:
            self.last_batch = last

    _replace(cls, "is_fully_idle", is_fully_idle, original)


# --- 11. the overlap loop's result processing ------------------------------------


def _install_mut_overlap_skips_emptied_last_batch_result(scheduler_module: Any) -> None:
    """``Scheduler.event_loop_overlap`` skips the previous batch's result
    when ``last_batch`` came out of filtering empty while a chunked prefill
    goes on. ``get_next_batch_to_run`` filters ``last_batch`` in place, and a
    chunk batch holding only the chunked request comes out empty, while
    ``result_queue`` holds its (unfiltered) copy: that result is not popped,
    and the queue runs one result behind from then on.

    Plausible: an "empty chunk batch, nothing to process" shortcut that
    forgets the queue holds a copy. The body is copied from 0.5.23 (checked
    by source digest) with ``if self.last_batch:`` made ``if self.last_batch
    and not (self.last_batch.is_empty() and self.chunked_req is not None):``
    (an earlier form skipped every emptied batch: a decode batch whose
    requests all finished too, so the server's own warm-up request crashed
    the scheduler at start and the mutant said nothing about the checks).

    Seen by: crash, SGLang's own ``assert len(self.result_queue) == 1`` in
    ``_reqs_finishing_inflight`` at the first decode after a prompt of two or
    more chunks (over 64 tokens); otherwise the end-state check (the last
    result is never processed: a request never finishes). pp1-overlap only."""
    mutant = "mut_overlap_skips_emptied_last_batch_result"
    cls = _scheduler_cls(scheduler_module, mutant)
    original = _method(cls, "event_loop_overlap", mutant)
    _check_copied_body(original, EVENT_LOOP_OVERLAP_DIGEST, mutant, "Scheduler.event_loop_overlap")
    grad_mode = _attr(scheduler_module, "DynamicGradMode", mutant, "sglang.srt.managers.scheduler.DynamicGradMode")
    envs = _attr(scheduler_module, "envs", mutant, "sglang.srt.managers.scheduler.envs")

    @grad_mode()
    def event_loop_overlap(self):
        """A scheduler loop that overlaps the CPU processing and GPU computation."""
        self.enable_skip_finishing_decode = True
        self.result_queue = deque()

        def pop_and_process():
            # Process the results of the last batch
            tmp_batch, tmp_result = self.result_queue.popleft()
            self.process_batch_result(tmp_batch, tmp_result)

        while True:
            if self.gracefully_exit:
                break

            # Receive requests
            self.ingest_requests()
            if self._engine_paused:
                self._record_scheduler_state_for_paused_engine()
                continue

            # Get the next batch to run
            plan = self.get_next_batch_to_run(
                running_batch=self.running_batch, last_batch=self.last_batch
            )
            self.running_batch = plan.running_batch
            batch = plan.batch_to_run
            self.cur_batch_for_debug = batch
            disable_overlap_for_batch = self.is_disable_overlap_for_batch(
                batch, last_batch=self.last_batch
            )

            # If we do not need to overlap the current batch with the last batch,
            # we can process the last batch immediately.
            if disable_overlap_for_batch:
                pop_and_process()
                # Opportunistic flush at the disable_overlap sync boundary:
                # forward_stream is idle (prev forward drained, next not launched),
                # so `_flush`'s non-urgent guard compacts freely. Sync-free, best-effort.
                if self.enable_unified_memory:
                    try:
                        self.token_to_kv_pool_allocator.flush_opportunistic()
                    except Exception:
                        pass

            # Launch the current batch
            if batch:
                batch_result = self.run_batch(batch)
                # Fence result processing behind this forward's shared reads.
                self._apply_war_barrier()
                self.result_queue.append((batch.copy(), batch_result))
            else:
                batch_result = None
                self._sched_idled = True

            # Process the last batch
            # MUTANT: was `if self.last_batch:`
            if self.last_batch and not (self.last_batch.is_empty() and self.chunked_req is not None):
                if not disable_overlap_for_batch:
                    pop_and_process()
            elif batch is None:
                # When the server is idle, do self-check and re-init some states
                self.on_idle()

            # Run sample of the current batch
            # It depends on the result of the last batch (e.g., grammar), so we run it after the last batch is processed.
            if self.is_generation:
                self.launch_batch_sample_if_needed(batch_result, batch)

            # Update last_batch
            self.last_batch = batch

            if envs.SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY.get():
                self.invariant_checker.self_check_during_busy()

    _replace(cls, "event_loop_overlap", _keep_crash_reporting(cls, event_loop_overlap), original)


# --- 12. the KV allocator's free path -----------------------------------------------


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
    _scheduler_cls(scheduler_module, mutant)
    alloc_cls = _attr(_module(TOKEN_ALLOCATOR, mutant), "TokenToKVPoolAllocator", mutant,
                      f"{TOKEN_ALLOCATOR}.TokenToKVPoolAllocator")
    original = _method(alloc_cls, "free", mutant, ("free_index",))

    def free(self, free_index):
        if getattr(self, "free_group", None) is None and free_index.numel() > 1:
            free_index = free_index[:-1]  # MUTANT: off by one, the last index is never freed
        return original(self, free_index)

    _replace(alloc_cls, "free", free, original)


# --- 13. update_weights' flush path -------------------------------------------------


def _install_mut_update_weights_flush_skips_idle_check(scheduler_module: Any) -> None:
    """``SchedulerWeightUpdaterManager.flush_cache_after_weight_update``
    flushes without ``flush_cache``'s idle test: with ``flush_cache=True``
    the tree, the req_to_token rows and the KV allocator are reset even while
    requests still hold them (the update is answered success).

    Plausible: "the engine is paused for a weight update, so it is idle"
    (true for a retract pause, not for an in-place pause, and not for an
    update that races finished-but-unpruned requests). Done by running the
    scheduler's own ``flush_cache`` with its ``is_fully_idle`` answering yes
    for the duration of that one call.

    Seen by: invariant slot_ownership (a live request's row or KV is on a
    free list) or radix_locks (a live request holds a node of the old tree)
    at the next iteration, after pause_generation(in_place) with a live
    request then update_weights(flush_cache=True); without a pause the
    explorer posts the update only once its requests finished, and the reset
    then harms no one. All topologies."""
    mutant = "mut_update_weights_flush_skips_idle_check"
    _scheduler_cls(scheduler_module, mutant)
    mgr_cls = _attr(_module(WEIGHT_UPDATER, mutant), "SchedulerWeightUpdaterManager", mutant,
                    f"{WEIGHT_UPDATER}.SchedulerWeightUpdaterManager")
    original = _method(mgr_cls, "flush_cache_after_weight_update", mutant, ("recv_req", "success", "message"))

    def _always_idle(*args, **kwargs) -> bool:
        return True

    def flush_cache_after_weight_update(self, recv_req, success, message):
        scheduler = self.scheduler
        if not recv_req.flush_cache or scheduler is None or not hasattr(scheduler, "__dict__"):
            return original(self, recv_req, success, message)
        shadowed = scheduler.__dict__.get("is_fully_idle", _NOTHING)
        scheduler.is_fully_idle = _always_idle  # MUTANT: the flush's idle test is skipped
        try:
            self.flush_cache(empty_cache=recv_req.torch_empty_cache)
        finally:
            if shadowed is _NOTHING:
                del scheduler.is_fully_idle
            else:
                scheduler.is_fully_idle = shadowed
        return success, message

    _replace(mgr_cls, "flush_cache_after_weight_update", flush_cache_after_weight_update, original)


# --- 14. waiting-queue admission ----------------------------------------------------


def _install_mut_admission_drops_next_waiting(scheduler_module: Any) -> None:
    """After forming a prefill batch, ``Scheduler._get_new_batch_prefill_raw``
    also removes the first request it did not admit (the one the admission
    loop stopped at) from the waiting queue: that request is never
    scheduled, holds nothing, and never gets an answer.

    Plausible: the waiting-queue update as a slice one past the loop's last
    index (``waiting_queue[i + 1:]``) instead of "every request not in
    can_run_list". Needs a request left waiting behind a prefill batch:
    several concurrent starts, or a prompt that fills the 64-token chunk.

    Seen by: the end-state check, since a request the scheduler took in and
    holds nowhere without a finish reason is ``lost`` (before, it counted as
    finished and nothing was leaked); or an update_weights after it: the
    tokenizer holds the update behind the lost generate request
    (ArrivalTimeout / UpdateAnswerTimeout). All topologies."""
    mutant = "mut_admission_drops_next_waiting"
    cls = _scheduler_cls(scheduler_module, mutant)
    original = _method(cls, "_get_new_batch_prefill_raw", mutant, ("prefill_delayer_single_pass", "running_batch"))

    def _get_new_batch_prefill_raw(self, *args, **kwargs):
        new_batch, running_batch = original(self, *args, **kwargs)
        if new_batch is not None and self.waiting_queue:
            self.waiting_queue = self.waiting_queue[1:]  # MUTANT: trimmed one past the admitted requests
        return new_batch, running_batch

    _replace(cls, "_get_new_batch_prefill_raw", _get_new_batch_prefill_raw, original)


# --- HiCache (pp1-hicache: HiCache on, a 400-token device pool) ------------------------------


def _install_mut_hicache_forward_skips_load_wait(scheduler_module: Any) -> None:
    """``TpModelWorker.set_hicache_consumer`` drops the batch's producer
    index (the consumer stays -1), so the forward's attention never waits on
    the layer events of the load-back it reads.

    Plausible: PR 19177's race. A CUDA-graph replay does not run the wait in
    ``get_key_buffer``; the scheduler's own TODO says "disable cuda graph
    execution if hicache loading triggered".

    Seen by: invariant hicache_load_before_read, once the transfer gate
    holds a load that a batch reads (explorer: hold loads, then a prefix
    evicted to the host asked for again). Without a held load the CPU copy
    completes where it is issued and nothing is read early."""
    mutant = "mut_hicache_forward_skips_load_wait"
    _scheduler_cls(scheduler_module, mutant)
    worker_cls = _attr(_module(TP_WORKER, mutant), "TpModelWorker", mutant, f"{TP_WORKER}.TpModelWorker")
    original = _method(worker_cls, "set_hicache_consumer", mutant, ("consumer_index",))

    def set_hicache_consumer(self, consumer_index: int):
        return original(self, -1)  # MUTANT: the batch's load is never waited on

    _replace(worker_cls, "set_hicache_consumer", set_hicache_consumer, original)


def _install_mut_hicache_write_through_skips_lock(scheduler_module: Any) -> None:
    """A node whose write-through backup is pending is not kept locked: the
    lock taken for the backup is dropped right away, so eviction may free
    the device slots the backup still reads.

    Plausible: the write-back policy takes no lock (``write_back=True``);
    sharing that path with write-through loses the lock.

    Seen by: invariant hicache_transfer_slots, once the gate holds a backup
    and the device pool needs the room (explorer: hold backups, finish a
    request, start others)."""
    mutant = "mut_hicache_write_through_skips_lock"
    _scheduler_cls(scheduler_module, mutant)
    cache_cls = _attr(_module(UNIFIED_RADIX_CACHE, mutant), "UnifiedRadixCache", mutant,
                      f"{UNIFIED_RADIX_CACHE}.UnifiedRadixCache")
    original = _method(cache_cls, "_track_write_through_node", mutant,
                       ("node_id", "lock_params", "publish_node_ids"))

    def _track_write_through_node(self, node_id, lock_params, publish_node_ids):
        if lock_params is not None:
            self.dec_lock_ref(node_id, lock_params)  # MUTANT: the backup's lock is dropped at once
        return original(self, node_id, None, publish_node_ids)

    _replace(cache_cls, "_track_write_through_node", _track_write_through_node, original)


def _install_mut_hicache_host_evict_leaks(scheduler_module: Any) -> None:
    """Host eviction frees each evicted node's host slots but the last one:
    that slot stays allocated in the host pool with no node holding it.

    Plausible: an off-by-one in a page-aligned slice of the evicted value
    (the device allocator's ``mut_kv_free_drops_last_index``, on the host).

    Seen by: invariant hicache_host_accounting (host slots allocated that no
    tree node holds), once the host pool fills and evicts (pp1-hicache's
    481-slot host pool: three long prompts)."""
    mutant = "mut_hicache_host_evict_leaks"
    _scheduler_cls(scheduler_module, mutant)
    component_cls = _attr(_module(FULL_COMPONENT, mutant), "FullComponent", mutant,
                          f"{FULL_COMPONENT}.FullComponent")
    original = _method(component_cls, "free_host_values", mutant, ("host_values",))

    def free_host_values(self, host_values):
        return original(self, [v[:-1] for v in host_values])  # MUTANT: each value's last slot leaks

    _replace(component_cls, "free_host_values", free_host_values, original)


# --- the table ------------------------------------------------------------------------

PP1 = ("pp1-overlap", "pp1-normal")
ALL = ("pp1-overlap", "pp1-normal", "pp4")
HICACHE = ("pp1-hicache",)

MUTANTS: Dict[str, Patch] = {
    p.name: p
    for p in (
        Patch("mut_pp_drain_first_slot_only",
              "PP is_fully_idle checks microbatch slot 0 only (a live request in another slot looks idle)",
              _install_mut_pp_drain_first_slot_only, ("pp4",),
              "invariant idle_gate"),
        Patch("mut_normal_loop_ignores_pause",
              "the normal event loop keeps scheduling while the engine is paused",
              _install_mut_normal_loop_ignores_pause, ("pp1-normal",),
              "contract pause (a forward launched while paused)"),
        Patch("mut_pause_retract_forgets_last_batch",
              "pause_generation(retract) does not retract the prefill batch just run (its requests are lost, "
              "holding row, KV and lock)",
              _install_mut_pause_retract_forgets_last_batch, PP1,
              "end-state check (a request lost: held nowhere, never finished), invariant radix_locks (if it "
              "was the only request), crash (SGLang's own idle req-pool leak check)"),
        Patch("mut_abort_keeps_row",
              "an aborted request's req_to_token row is forgotten, never freed",
              _install_mut_abort_keeps_row, ALL,
              "crash (SGLang's own idle req-pool leak check), else end-state check (rows not all free)"),
        Patch("mut_abort_double_free_kv",
              "a decoding request finished by abort has its KV freed twice",
              _install_mut_abort_double_free_kv, ALL,
              "invariant pool_accounting"),
        Patch("mut_checkpoint_keeps_old_lock",
              "a checkpoint into the radix tree locks the new node without unlocking the old one",
              _install_mut_checkpoint_keeps_old_lock, ALL,
              "invariant radix_locks (locked nodes at idle), end-state check (tokens still protected)"),
        Patch("mut_release_without_checkpoint_keeps_lock",
              "a release without checkpoint (retract, chunked abort) never unlocks the request's tree node",
              _install_mut_release_without_checkpoint_keeps_lock, ALL,
              "invariant radix_locks (locked nodes at idle), end-state check (tokens still protected)"),
        Patch("mut_chunk_alloc_ignores_held_row",
              "a chunked request's later chunk takes a fresh req_to_token row; the old one leaks",
              _install_mut_chunk_alloc_ignores_held_row, ALL,
              "invariant slot_ownership (row moved between chunks)"),
        Patch("mut_prune_keeps_aborted",
              "filter_batch keeps requests finished by abort in the running batch (decoded on a released row)",
              _install_mut_prune_keeps_aborted, ALL,
              "contract abort (launched again after its abort finished it), crash (SGLang's own assert in "
              "release_kv_cache; pp1-normal, pp4), invariant pool_accounting (pp1-overlap)"),
        Patch("mut_idle_gate_ignores_last_batch",
              "is_fully_idle ignores last_batch (a prefill just run, not merged yet, looks idle)",
              _install_mut_idle_gate_ignores_last_batch, ("pp1-normal",),
              "invariant idle_gate"),
        Patch("mut_overlap_skips_emptied_last_batch_result",
              "the overlap loop skips the queued result of a last_batch emptied by filtering (chunk batches)",
              _install_mut_overlap_skips_emptied_last_batch_result, ("pp1-overlap",),
              "crash (SGLang's own assert len(result_queue) == 1), else end-state check"),
        Patch("mut_kv_free_drops_last_index",
              "the KV allocator's free drops the last index of a multi-index free (a slot leaks)",
              _install_mut_kv_free_drops_last_index, ALL,
              "invariant pool_accounting"),
        Patch("mut_update_weights_flush_skips_idle_check",
              "update_weights(flush_cache=True) resets the pools without the idle test",
              _install_mut_update_weights_flush_skips_idle_check, ALL,
              "contract update_weights (a flush accepted while a live request holds KV; needs an in-place "
              "pause with a live request), invariant slot_ownership or radix_locks"),
        Patch("mut_admission_drops_next_waiting",
              "prefill admission also drops the first request it did not admit from the waiting queue",
              _install_mut_admission_drops_next_waiting, ALL,
              "end-state check (a request lost: held nowhere, never finished), or a weight update waiting "
              "behind it in the tokenizer (ArrivalTimeout)"),
        Patch("mut_hicache_forward_skips_load_wait",
              "the forward never waits on the HiCache load-back it reads (PR 19177: a CUDA-graph replay)",
              _install_mut_hicache_forward_skips_load_wait, HICACHE,
              "invariant hicache_load_before_read"),
        Patch("mut_hicache_write_through_skips_lock",
              "a node whose write-through backup is pending is not locked (eviction can free what it reads)",
              _install_mut_hicache_write_through_skips_lock, HICACHE,
              "invariant hicache_transfer_slots"),
        Patch("mut_hicache_host_evict_leaks",
              "host eviction frees each evicted node's host slots but the last (one leaks per node)",
              _install_mut_hicache_host_evict_leaks, HICACHE,
              "invariant hicache_host_accounting"),
    )
}
