"""Mutants of what enters and leaves a batch: prefill admission from the
waiting queue, and the pruning of finished requests."""
from __future__ import annotations

from typing import Any

from scripted_runtime.hooks.mutants.base import (ALL, SCHEDULE_BATCH, mutant, find_attr, find_method, find_module,
                                                 replace_attr, scheduler_class)


# --- pruning of finished requests -------------------------------------------------


@mutant("mut_prune_keeps_aborted", topologies=ALL,
        summary="filter_batch keeps requests finished by abort in the running batch (decoded on a released row)",
        expected="contract abort (launched again after its abort finished it), crash (SGLang's own assert in "
                 "release_kv_cache; pp1-normal, pp4), invariant pool_accounting (pp1-overlap)")
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
    scheduler_class(scheduler_module, mutant)
    sb = find_module(SCHEDULE_BATCH, mutant)
    batch_cls = find_attr(sb, "ScheduleBatch", mutant, f"{SCHEDULE_BATCH}.ScheduleBatch")
    req_cls = find_attr(sb, "Req", mutant, f"{SCHEDULE_BATCH}.Req")
    finish_abort = find_attr(sb, "FINISH_ABORT", mutant, f"{SCHEDULE_BATCH}.FINISH_ABORT")
    original = find_method(batch_cls, "filter_batch", mutant, ("reqs_to_exclude", "keep_indices"))

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

    replace_attr(batch_cls, "filter_batch", filter_batch, original)


# --- waiting-queue admission ------------------------------------------------------


@mutant("mut_admission_drops_next_waiting", topologies=ALL,
        summary="prefill admission also drops the first request it did not admit from the waiting queue",
        expected="end-state check (a request lost: held nowhere, never finished), or a weight update waiting "
                 "behind it in the tokenizer (ArrivalTimeout)")
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
    cls = scheduler_class(scheduler_module, mutant)
    original = find_method(cls, "_get_new_batch_prefill_raw", mutant, ("prefill_delayer_single_pass", "running_batch"))

    def _get_new_batch_prefill_raw(self, *args, **kwargs):
        new_batch, running_batch = original(self, *args, **kwargs)
        if new_batch is not None and self.waiting_queue:
            self.waiting_queue = self.waiting_queue[1:]  # MUTANT: trimmed one past the admitted requests
        return new_batch, running_batch

    replace_attr(cls, "_get_new_batch_prefill_raw", _get_new_batch_prefill_raw, original)
