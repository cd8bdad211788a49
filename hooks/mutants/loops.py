"""Mutants of the event loops and the pause: the normal loop's pause check,
``pause_generation(retract)``, the overlap loop's result queue. The two loop
mutants copy a 0.5.23 loop body (guarded by its source digest) and keep the
harness's crash reporting."""
from __future__ import annotations

from collections import deque
from typing import Any, Callable

from scripted_runtime.hooks.mutants.base import (PP1, mutant, find_attr, check_copied_body, find_method, missing_target,
                                                 replace_attr, scheduler_class)

# Digests of the 0.5.23 method bodies that two mutants copy (normalized
# source: dedented, blank lines dropped, trailing space stripped).
EVENT_LOOP_NORMAL_DIGEST = "1ff5012fa2b18867"
EVENT_LOOP_OVERLAP_DIGEST = "b3cbd1f2e07e5466"


def _keep_crash_reporting(scheduler_cls: type, loop: Callable) -> Callable:
    """A replaced event loop keeps the harness's crash reporting (the hook
    wraps the loops at import, before patches are installed)."""
    if not getattr(scheduler_cls, "_scripted_runtime_installed", False):
        return loop
    from scripted_runtime.hooks import scheduler_hook

    return scheduler_hook.report_crashes(loop)


# --- the pause check of the normal loop -------------------------------------------


@mutant("mut_normal_loop_ignores_pause", topologies=("pp1-normal",),
        summary="the normal event loop keeps scheduling while the engine is paused",
        expected="contract pause (a forward launched while paused)")
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
    cls = scheduler_class(scheduler_module, mutant)
    original = find_method(cls, "event_loop_normal", mutant)
    check_copied_body(original, EVENT_LOOP_NORMAL_DIGEST, mutant, "Scheduler.event_loop_normal")
    grad_mode = find_attr(scheduler_module, "DynamicGradMode", mutant, "sglang.srt.managers.scheduler.DynamicGradMode")
    envs = find_attr(scheduler_module, "envs", mutant, "sglang.srt.managers.scheduler.envs")

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

    replace_attr(cls, "event_loop_normal", _keep_crash_reporting(cls, event_loop_normal), original)


# --- retract in pause_generation --------------------------------------------------


@mutant("mut_pause_retract_forgets_last_batch", topologies=PP1,
        summary="pause_generation(retract) does not retract the prefill batch just run (its requests are lost, "
                "holding row, KV and lock)",
        expected="end-state check (a request lost: held nowhere, never finished), invariant radix_locks (if it "
                 "was the only request), crash (SGLang's own idle req-pool leak check)")
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
    cls = scheduler_class(scheduler_module, mutant)
    original = find_method(cls, "pause_generation", mutant, ("recv_req",))
    find_method(cls, "process_batch_result", mutant)
    null_mode = getattr(getattr(scheduler_module, "DisaggregationMode", None), "NULL", None)
    if null_mode is None:
        raise missing_target(mutant, "sglang.srt.managers.scheduler.DisaggregationMode.NULL")

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

    replace_attr(cls, "pause_generation", pause_generation, original)


# --- the overlap loop's result processing -----------------------------------------


@mutant("mut_overlap_skips_emptied_last_batch_result", topologies=("pp1-overlap",),
        summary="the overlap loop skips the queued result of a last_batch emptied by filtering (chunk batches)",
        expected="crash (SGLang's own assert len(result_queue) == 1), else end-state check")
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
    cls = scheduler_class(scheduler_module, mutant)
    original = find_method(cls, "event_loop_overlap", mutant)
    check_copied_body(original, EVENT_LOOP_OVERLAP_DIGEST, mutant, "Scheduler.event_loop_overlap")
    grad_mode = find_attr(scheduler_module, "DynamicGradMode", mutant, "sglang.srt.managers.scheduler.DynamicGradMode")
    envs = find_attr(scheduler_module, "envs", mutant, "sglang.srt.managers.scheduler.envs")

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

    replace_attr(cls, "event_loop_overlap", _keep_crash_reporting(cls, event_loop_overlap), original)
