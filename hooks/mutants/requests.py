"""Mutants of request semantics: how a request ends (its length cap, its
stop tokens), whatever ran beside it. ``mut_stop_token_checked_one_step_late``
was written blind (issue 34, item 5): the harness's checks were not read, so
its ``expected`` is a guess of what should notice the bug.
``mut_stop_ids_masked_by_eos`` was written blind as a second set (issue 34):
the harness's checks and what its explorer draws were not read, and it was
measured as an external patch before anyone read it."""
from __future__ import annotations

from typing import Any, List

from scripted_runtime.hooks.mutants.base import (ALL, SCHEDULE_BATCH, check_copied_body, mutant, find_attr,
                                                 find_method, find_module, replace_attr, scheduler_class)

# Digest of the 0.5.23 body that mut_stop_ids_masked_by_eos copies
# (normalized source: dedented, blank lines dropped, trailing space stripped).
CHECK_TOKEN_BASED_FINISH_DIGEST = "2cb5a0733caf7a14"


@mutant("mut_length_cap_one_early", topologies=ALL,
        summary="update_finish_state ends a request at max_new_tokens - 1 tokens and reports it as a length finish",
        expected="output oracle (a length finish short of its reference); request contract where the oracle compares nothing")
def _install_mut_length_cap_one_early(scheduler_module: Any) -> None:
    """``Req.update_finish_state`` compares the output length with
    ``max_new_tokens - 1``: every request asking for two tokens or more ends
    one token early, and its answer says ``length``.

    Plausible: an off-by-one in the length cap, e.g. a cap rewritten to count
    the token the prefill sampled separately, or a ``>=`` that became ``>``
    on a length that already counts the next token.

    Seen by: the output oracle in a greedy exploration (a ``length`` finish
    must hold exactly ``max_new_tokens`` tokens of its reference), and where
    the oracle compares nothing (sampled requests, a GPU, ``greedy_output``
    off) the request-semantics contract (a ``length`` finish with fewer than
    ``max_new_tokens`` tokens). The server's warm-up request ends one token
    early too, which SGLang does not notice: the server starts. All
    topologies."""
    mutant = "mut_length_cap_one_early"
    scheduler_class(scheduler_module, mutant)  # the scheduler module it was asked to patch, else PatchError
    sb = find_module(SCHEDULE_BATCH, mutant)
    req_cls = find_attr(sb, "Req", mutant, f"{SCHEDULE_BATCH}.Req")
    finish_length = find_attr(sb, "FINISH_LENGTH", mutant, f"{SCHEDULE_BATCH}.FINISH_LENGTH")
    original = find_method(req_cls, "update_finish_state", mutant, ("new_accepted_len",))

    def update_finish_state(self, new_accepted_len: int = 1):
        original(self, new_accepted_len)
        cap = self.sampling_params.max_new_tokens
        # MUTANT: the length cap is checked against max_new_tokens - 1
        if not self.finished() and cap is not None and cap > 1 and len(self.output_ids) >= cap - 1:
            self.finished_reason = finish_length(length=cap)
            self.finished_len = len(self.output_ids)

    replace_attr(req_cls, "update_finish_state", update_finish_state, original)


@mutant("mut_stop_token_checked_one_step_late", topologies=ALL,
        summary="the stop-token check reads the previous step's token: a stop ends the request one token late, "
                "and a stop as the first token is never seen",
        expected="unknown (written blind); should show as wrong outputs (one token after the stop token; a "
                 "first-token stop ignored)")
def _install_mut_stop_token_checked_one_step_late(scheduler_module: Any) -> None:
    """``Req._check_token_based_finish`` (stop token ids, EOS) is handed the
    tokens accepted one step earlier (``output_ids[-n - 1:-1]`` instead of
    ``output_ids[-n:]``): a stop token generated at step k is only seen at
    step k + 1, and the finish is placed where the check thinks it found it,
    at the last token, so the answer holds the stop token and one token
    after it. The first generated token is never checked (the slice before
    it is empty): a stop as the first token is ignored, and so is a stop at
    the last allowed position (the length cap ends the request first, as a
    ``length`` finish).

    Plausible: the slice taken from ``output_ids`` before the step's tokens
    are appended (e.g. a helper hoisted above ``output_ids.extend`` in the
    result processor), or an off-by-one in a negative slice. The length cap
    and the vocabulary check still read the right tokens.

    Trigger: a request with ``stop_token_ids`` (or EOS) that generates one of
    them; the first generated token being a stop shows the second half. The
    warm-up request asks for no stop token (an EOS it may generate would
    only end it one token later).

    Seen by (written blind): a stop-token finish whose answer does not end
    at its stop token (one token more than the same prompt run alone), a
    first-token stop that does not finish the request. All topologies."""
    mutant = "mut_stop_token_checked_one_step_late"
    scheduler_class(scheduler_module, mutant)
    req_cls = find_attr(find_module(SCHEDULE_BATCH, mutant), "Req", mutant, f"{SCHEDULE_BATCH}.Req")
    original = find_method(req_cls, "_check_token_based_finish", mutant, ("new_accepted_tokens",))

    def _check_token_based_finish(self, new_accepted_tokens) -> bool:
        n = len(new_accepted_tokens)
        previous = list(self.output_ids[-n - 1:-1]) if n else []  # MUTANT: was output_ids[-n:]
        return original(self, previous)

    replace_attr(req_cls, "_check_token_based_finish", _check_token_based_finish, original)


# --- written blind, second set: the EOS check overwrites a stop-token match ----------


@mutant("mut_stop_ids_masked_by_eos", topologies=ALL,
        summary="the model's EOS check overwrites a request's stop_token_ids match: user stop tokens never end a request",
        expected="unknown (written blind); should show as wrong outputs (a request runs on past its stop token to "
                 "max_new_tokens or EOS, finish reason length instead of the matched stop token)")
def _install_mut_stop_ids_masked_by_eos(scheduler_module: Any) -> None:
    """``Req._check_token_based_finish`` folds the per-token matches with
    ``|=`` (user stop_token_ids, then the model's EOS ids, then the
    tokenizer's). Here the EOS line assigns instead (``matched_eos = token_id
    in self.eos_token_ids``): whenever the model declares EOS ids, the match
    against the request's own ``stop_token_ids`` is overwritten before it is
    looked at, so a user stop token never ends the request. The model's EOS
    still works, and so does everything else (max_new_tokens, abort).

    Plausible: a one-character slip (``=`` for ``|=``) in a chain of
    accumulating checks; every test that stops on EOS, or on a stop token of a
    model without EOS ids, still passes. The body is copied from 0.5.23
    (checked by source digest) with that one line changed.

    Trigger: a request with ``stop_token_ids`` whose greedy output reaches one
    of them (the tiny model declares ``eos_token_id`` 2, so ``eos_token_ids``
    is non-empty), and ``ignore_eos`` off. The warm-up sends no stop ids.

    Seen by (written blind), as a user sees it: the request does not stop at
    its stop token; it runs on to ``max_new_tokens`` (or the EOS), so the
    answer has extra tokens after the stop token and ``finish_reason`` is
    ``length`` instead of a matched stop token. No crash, no leak. All
    topologies."""
    mutant = "mut_stop_ids_masked_by_eos"
    scheduler_class(scheduler_module, mutant)
    sb = find_module(SCHEDULE_BATCH, mutant)
    req_cls = find_attr(sb, "Req", mutant, f"{SCHEDULE_BATCH}.Req")
    finish_matched_token = find_attr(sb, "FINISH_MATCHED_TOKEN", mutant, f"{SCHEDULE_BATCH}.FINISH_MATCHED_TOKEN")
    original = find_method(req_cls, "_check_token_based_finish", mutant, ("new_accepted_tokens",))
    check_copied_body(original, CHECK_TOKEN_BASED_FINISH_DIGEST, mutant, "Req._check_token_based_finish")

    def _check_token_based_finish(self, new_accepted_tokens: List[int]) -> bool:
        if self.sampling_params.ignore_eos:
            return False

        # Check stop token ids
        matched_eos = False

        for i, token_id in enumerate(new_accepted_tokens):
            if self.sampling_params.stop_token_ids:
                matched_eos |= token_id in self.sampling_params.stop_token_ids
            if self.eos_token_ids:
                matched_eos = token_id in self.eos_token_ids  # MUTANT: was `matched_eos |= ...`
            if self.tokenizer is not None:
                matched_eos |= token_id == self.tokenizer.eos_token_id
                if self.tokenizer.additional_stop_token_ids:
                    matched_eos |= token_id in self.tokenizer.additional_stop_token_ids
            if matched_eos:
                self.finished_reason = finish_matched_token(matched=token_id)
                matched_pos = len(self.output_ids) - len(new_accepted_tokens) + i
                self.finished_len = matched_pos + 1
                return True

        return False

    replace_attr(req_cls, "_check_token_based_finish", _check_token_based_finish, original)
