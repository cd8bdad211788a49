"""Mutants of the idle gate and what trusts it: ``is_fully_idle`` (the PP
microbatch drain check, the ``last_batch`` term), the flush after a
weight update, which must not reset the pools under live requests, and the
flush's own gate while the engine is paused.
``mut_flush_refused_while_paused`` was written blind as a second set (issue
34): the harness's checks and what its explorer draws were not read, and it
was measured as an external patch before anyone read it, so its
``expected`` is a guess of what should notice the bug."""
from __future__ import annotations

import logging
from typing import Any

from scripted_runtime.hooks.mutants.base import (ALL, WEIGHT_UPDATER, check_copied_body, mutant, find_attr,
                                                 find_method, find_module, replace_attr, scheduler_class)

# Digest of the 0.5.23 body that mut_flush_refused_while_paused copies
# (normalized source: dedented, blank lines dropped, trailing space stripped).
FLUSH_CACHE_DIGEST = "ed54b42daa73397f"

_NOTHING = object()


# --- the PP drain check -----------------------------------------------------------


@mutant("mut_pp_drain_first_slot_only", topologies=("pp4",),
        summary="PP is_fully_idle checks microbatch slot 0 only (a live request in another slot looks idle)",
        expected="invariant idle_gate")
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
    cls = scheduler_class(scheduler_module, mutant)
    original = find_method(cls, "_pp_microbatches_drained", mutant)
    get_parallel = find_attr(scheduler_module, "get_parallel", mutant, "sglang.srt.managers.scheduler.get_parallel")

    def _pp_microbatches_drained(self) -> bool:
        if get_parallel().pp_size == 1:
            return True
        first = self.mbs[0]
        return self.running_mbs[0].is_empty() and (first is None or first.is_empty())  # MUTANT: slot 0 only

    replace_attr(cls, "_pp_microbatches_drained", _pp_microbatches_drained, original)


# --- the idle gate ----------------------------------------------------------------


@mutant("mut_idle_gate_ignores_last_batch", topologies=("pp1-normal",),
        summary="is_fully_idle ignores last_batch (a prefill just run, not merged yet, looks idle)",
        expected="invariant idle_gate")
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
    cls = scheduler_class(scheduler_module, mutant)
    original = find_method(cls, "is_fully_idle", mutant, ("for_health_check", "ignore_waiting"))

    def is_fully_idle(self, for_health_check=False, ignore_waiting=False) -> bool:
        last = self.last_batch
        self.last_batch = None  # MUTANT: `(self.last_batch is None or self.last_batch.is_empty())` dropped
        try:
            return original(self, for_health_check=for_health_check, ignore_waiting=ignore_waiting)
        finally:
            self.last_batch = last

    replace_attr(cls, "is_fully_idle", is_fully_idle, original)


# --- update_weights' flush path ---------------------------------------------------


@mutant("mut_update_weights_flush_skips_idle_check", topologies=ALL,
        summary="update_weights(flush_cache=True) resets the pools without the idle test",
        expected="contract update_weights (a flush accepted while a live request holds KV; needs an in-place "
                 "pause with a live request), invariant slot_ownership or radix_locks")
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
    scheduler_class(scheduler_module, mutant)
    mgr_cls = find_attr(find_module(WEIGHT_UPDATER, mutant), "SchedulerWeightUpdaterManager", mutant,
                    f"{WEIGHT_UPDATER}.SchedulerWeightUpdaterManager")
    original = find_method(mgr_cls, "flush_cache_after_weight_update", mutant, ("recv_req", "success", "message"))

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

    replace_attr(mgr_cls, "flush_cache_after_weight_update", flush_cache_after_weight_update, original)


# --- written blind, second set: the flush's gate forgets the pause -------------------


@mutant("mut_flush_refused_while_paused", topologies=ALL,
        summary="flush_cache counts queued requests as busy even while paused: after pause(retract) a flush or a "
                "weight update's flush is refused and the old prefix cache survives",
        expected="unknown (written blind); should show as a refused flush (flush_cache, or update_weights' flush, "
                 "answers failure after a pause with queued requests) and the old prefix cache still hit after it")
def _install_mut_flush_refused_while_paused(scheduler_module: Any) -> None:
    """``Scheduler.flush_cache`` checks ``self.is_fully_idle()`` instead
    of ``self.is_fully_idle(ignore_waiting=self._engine_paused)``. While the
    engine is paused, queued requests hold no KV (a retract pause frees the
    KV of every request it puts back in the queue), so 0.5.23 lets a flush
    run; with the mutant any queued request makes the flush fail. This is
    the "pause(retract) -> update weights -> continue" flow: the weights are
    loaded, then ``flush_cache_after_weight_update`` is refused and the
    update reports failure, and the prefix cache computed with the old
    weights survives into the resumed generation.

    Plausible: a "simplification" that drops the ``ignore_waiting`` argument
    (or a copy of the idle gate from ``attach/detach_hicache_storage``, which
    use the plain check); unpaused flushes, and paused flushes with an empty
    queue (pause in_place of an idle engine, pause(abort)), behave as before.
    The body is copied from 0.5.23 (checked by source digest) with that one
    call changed.

    Trigger: pause_generation(mode=retract) while requests are running or
    queued (they all end up in the waiting queue), or any pause while
    requests are queued, then flush_cache or update_weights_from_disk (flush
    on by default), then continue_generation.

    Seen by (written blind), as a user sees it: flush_cache answers
    success=False ("Cache not flushed"); update_weights_from_disk answers
    success=False with "Weights were updated, but the cache was not flushed
    ..."; after continue, the resumed requests and repeated prompts still
    hit the pre-update prefix cache (``cached_tokens`` > 0 where a flush
    should have made it 0). With the same weights reloaded the tokens
    themselves do not change. No crash, no leak. All topologies."""
    mutant = "mut_flush_refused_while_paused"
    cls = scheduler_class(scheduler_module, mutant)
    find_method(cls, "is_fully_idle", mutant, ("for_health_check", "ignore_waiting"))
    current_platform = find_attr(scheduler_module, "current_platform", mutant,
                                 "sglang.srt.managers.scheduler.current_platform")
    logger = find_attr(scheduler_module, "logger", mutant, "sglang.srt.managers.scheduler.logger")
    original = find_method(cls, "flush_cache", mutant, ("empty_cache",))
    check_copied_body(original, FLUSH_CACHE_DIGEST, mutant, "Scheduler.flush_cache")

    def flush_cache(self, empty_cache: bool = True):
        """Flush memory pools (e.g., KV cache, Mamba cache) and optionally empty device allocator cache."""
        if self.is_fully_idle():  # MUTANT: was is_fully_idle(ignore_waiting=self._engine_paused)
            self.cur_batch_for_debug = None
            self.last_batch = None
            self.tree_cache.reset()
            self.req_to_token_pool.clear()
            self.token_to_kv_pool_allocator.clear()
            self.req_to_token_pool.reset_aux_cache_allocator()
            self.grammar_manager.clear()
            self.metrics_reporter.reset_metrics()

            if self.draft_worker:
                self.draft_worker.clear_cache_pool()

            if empty_cache:
                current_platform.empty_cache()
            # Per-DP-group leader logs once: ranks within a DP group are
            # state-synchronous, but DP groups may diverge.
            if self.metrics_reporter.is_stats_logging_rank:
                logger.info("Cache flushed successfully!")
            success = True
        else:
            logging.warning(
                f"Cache not flushed because there are pending requests. "
                f"#queue-req: {len(self.waiting_queue)}, "
                f"#running-req: {len(self.running_batch.reqs)}"
            )
            success = False
        return success

    replace_attr(cls, "flush_cache", flush_cache, original)
