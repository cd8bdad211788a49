"""Mutants of request semantics: how a request ends (its length cap, its
stop tokens), whatever ran beside it."""
from __future__ import annotations

from typing import Any

from scripted_runtime.hooks.mutants.base import (ALL, SCHEDULE_BATCH, mutant, find_attr, find_method, find_module,
                                                 replace_attr, scheduler_class)


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
