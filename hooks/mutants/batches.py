"""Mutants of what enters and leaves a batch: prefill admission from the
waiting queue, the pruning of finished requests, and which requests the
overlap loop leaves out of the next decode batch.
``mut_overlap_drops_last_token_req`` was written blind as a second set
(issue 34): the harness's checks and what its explorer draws were not read,
and it was measured as an external patch before anyone read it, so its
``expected`` is a guess of what should notice the bug."""
from __future__ import annotations

from typing import Any

from scripted_runtime.hooks.mutants.base import (ALL, SCHEDULE_BATCH, check_copied_body, mutant, find_attr,
                                                 find_method, find_module, replace_attr, scheduler_class)

# Digest of the 0.5.23 body that mut_overlap_drops_last_token_req copies
# (normalized source: dedented, blank lines dropped, trailing space stripped).
REQS_FINISHING_INFLIGHT_DIGEST = "f27c9cc99dfe46be"


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
        expected="end-state check (a request lost: held nowhere, never finished), at the program's end or "
                 "when a weight update would wait behind it in the tokenizer")
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
    finished and nothing was leaked); an explored weight update after it
    says so before posting (the tokenizer would hold the update behind the
    lost generate request until a wall-clock timeout, a symptom that did
    not replay). All topologies."""
    mutant = "mut_admission_drops_next_waiting"
    cls = scheduler_class(scheduler_module, mutant)
    original = find_method(cls, "_get_new_batch_prefill_raw", mutant, ("prefill_delayer_single_pass", "running_batch"))

    def _get_new_batch_prefill_raw(self, *args, **kwargs):
        new_batch, running_batch = original(self, *args, **kwargs)
        if new_batch is not None and self.waiting_queue:
            self.waiting_queue = self.waiting_queue[1:]  # MUTANT: trimmed one past the admitted requests
        return new_batch, running_batch

    replace_attr(cls, "_get_new_batch_prefill_raw", _get_new_batch_prefill_raw, original)


# --- the overlap loop's decode batch: a request its queued result does not finish -----


@mutant("mut_overlap_drops_last_token_req", topologies=("pp1-overlap",),
        summary="overlap: a request one token short of max_new_tokens is dropped from the running batch even when "
                "its last token is not in the queued result (it never finishes; KV stays held)",
        expected="unknown (written blind); should show as a request that never finishes (stopped one token short "
                 "of max_new_tokens, no answer) and a KV and row leak once the engine is otherwise idle")
def _install_mut_overlap_drops_last_token_req(scheduler_module: Any) -> None:
    """``Scheduler._reqs_finishing_inflight`` (overlap loop only,
    ``enable_skip_finishing_decode``) lists the running requests whose
    *queued* result commits their last output token, so that
    ``update_running_batch`` can leave them out of the next decode batch
    (``filter_batch(reqs_to_exclude=...)``, which drops them from the
    running batch for good). Here the ``req in queued_reqs`` condition is
    gone: every request one token short of ``max_new_tokens`` is dropped,
    also one that is not in the queued batch -- its last token is not
    coming. That happens whenever the queued batch is a prefill batch (a new
    request was admitted in the previous step instead of a decode): the
    decoding requests are not in it, their outputs are up to date, and a
    request with exactly one token left is removed from the running batch
    still holding its KV and request row, with nobody left to finish it.

    Plausible: "a request whose next output finishes it by length need not
    decode again" reads right if one forgets that the queued batch may not
    contain it; with one request, or when every step is a decode, the two
    conditions agree. The body is copied from 0.5.23 (checked by source
    digest) with that condition removed.

    Trigger: overlap loop; a new request's prefill runs in the step right
    after which another running request has exactly ``max_new_tokens - 1``
    output tokens (i.e. its result for that token was processed and a
    prefill, not a decode, was queued). Needs two or more requests with
    staggered arrival; a single warm-up request is never affected.

    Seen by (written blind), as a user sees it: that request never finishes:
    its client hangs (no final answer, the stream stops one token short),
    its KV and request row stay allocated (the pool never drains: SGLang's
    own idle leak check, if strict, raises once the engine is otherwise
    idle), and a later pause/flush/update_weights that waits for idle never
    gets there. Overlap loop only."""
    mutant = "mut_overlap_drops_last_token_req"
    cls = scheduler_class(scheduler_module, mutant)
    find_method(cls, "update_running_batch", mutant, ("batch",))
    original = find_method(cls, "_reqs_finishing_inflight", mutant, ("batch",))
    check_copied_body(original, REQS_FINISHING_INFLIGHT_DIGEST, mutant, "Scheduler._reqs_finishing_inflight")

    def _reqs_finishing_inflight(self, batch):
        """Requests whose queued result commits their last output by length."""
        if not self.enable_skip_finishing_decode or not self.result_queue:
            return []
        # At scheduling time the overlap loop has processed every result but the last.
        assert len(self.result_queue) == 1
        set(self.result_queue[0][0].reqs)  # MUTANT: `queued_reqs = ...` is built, no longer consulted
        return [
            req
            for req in batch.reqs
            # MUTANT: `req in queued_reqs and` removed
            if req.beam_group is None
            and req.next_output_finishes_by_length()
        ]

    replace_attr(cls, "_reqs_finishing_inflight", _reqs_finishing_inflight, original)
