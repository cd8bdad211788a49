"""Mutants of what the scheduler streams out: the incremental output a
request sends (its send offset) and whether a finished request's answer is
sent at all. Written blind (issue 34, item 5): the harness's checks were not
read, so ``expected`` is a guess of what should notice the bug."""
from __future__ import annotations

from typing import Any

from scripted_runtime.hooks.mutants.base import (ALL, OUTPUT_STREAMER, mutant, find_attr, find_method, find_module,
                                                 replace_attr, scheduler_class)


# --- the send offset: the last token sent is sent again ---------------------------


@mutant("mut_stream_resends_last_token", topologies=ALL,
        summary="an unfinished request's send offset stops one short: each partial output's last token is sent again",
        expected="unknown (written blind); should show as wrong outputs (a token repeated at every partial "
                 "output: streamed requests, or non-streamed ones past 50 tokens)")
def _install_mut_stream_resends_last_token(scheduler_module: Any) -> None:
    """``_GenerationStreamAccumulator.accept`` sets ``req.send_token_offset``
    to ``len(output_ids) - 1`` after a partial output of an unfinished
    request (it was ``len(output_ids)``): the next output of that request
    starts with the token the previous one ended with, and the tokenizer,
    which concatenates the deltas, holds it twice. The finishing output
    still advances the offset to the end.

    Plausible: "hold the last token back, a stop string may still grow
    across it" (the streamer already withholds an output whose tail is a
    stop-string prefix), written on the offset instead of on what is sent.

    Trigger: a request that sends more than one output: a streamed request
    (``stream=True``, every step by default) generating two tokens or more,
    or a non-streamed one passing 50 tokens (SGLANG_FORCE_STREAM_INTERVAL,
    a partial output every 50). The warm-up request (8 tokens, not streamed)
    sends once.

    Seen by (written blind): the request's answer has more tokens than it
    generated (``completion_tokens`` still counts the right number), with
    its partial outputs' last tokens duplicated; a greedy answer differs
    from the same prompt run alone. All topologies."""
    mutant = "mut_stream_resends_last_token"
    scheduler_class(scheduler_module, mutant)
    acc_cls = find_attr(find_module(OUTPUT_STREAMER, mutant), "_GenerationStreamAccumulator", mutant,
                        f"{OUTPUT_STREAMER}._GenerationStreamAccumulator")
    original = find_method(acc_cls, "accept", mutant, ("req",))

    def accept(self, *, req) -> None:
        sent_before = len(self.rids)
        original(self, req=req)
        if len(self.rids) > sent_before and not req.finished() and req.send_token_offset > 0:
            req.send_token_offset -= 1  # MUTANT: was `req.send_token_offset = len(output_ids_)`

    replace_attr(acc_cls, "accept", accept, original)


# --- the prefill result of a chunked prompt is not streamed -----------------------


@mutant("mut_chunked_prefill_answer_withheld", topologies=ALL,
        summary="stream_output skips every request whose prompt took several extends and has not decoded (its last "
                "chunk too): one that finishes there never gets its answer",
        expected="unknown (written blind); should show as a request that never gets an answer (a chunked prompt "
                 "with max_new_tokens=1)")
def _install_mut_chunked_prefill_answer_withheld(scheduler_module: Any) -> None:
    """``SchedulerOutputStreamer.stream_output`` leaves out, besides the
    ``skip_req`` it is handed (the request still being chunked), every
    request that ran more than one extend batch and has not been in a decode
    batch yet (``extend_batch_idx > 1 and decode_batch_idx == 0``). That is
    true of a chunked request between its chunks, and also at the result of
    its last chunk: its first token is not streamed there. A request that
    decodes on sends it with its next output (nothing lost), but one that
    finishes at that prefill (its only token) is never streamed again: it
    is released and its answer never leaves the scheduler.

    Plausible: the chunked request's skip recomputed per request from its
    own counters ("still prefilling: extended more than once, never
    decoded") instead of threaded through as ``skip_req``; the counters
    cannot tell the last chunk from a middle one, and the common case (the
    request decodes on) shows nothing.

    Trigger: a prompt longer than one chunk (64 tokens on CPU) whose request
    finishes at its prefill: ``max_new_tokens=1`` (every loop, as the source
    reads: the overlap loop keeps a request that its queued result finishes
    by length out of the next decode batch), or a first token that is a stop token (pp1-normal at
    least: the overlap loop has put such a request in a decode batch before
    it streams the prefill result). The warm-up prompt is one chunk.

    Seen by (written blind): the request never gets an answer (the client
    waits; the scheduler holds nothing for it), a timeout or a lost request
    at the end. All topologies."""
    mutant = "mut_chunked_prefill_answer_withheld"
    scheduler_class(scheduler_module, mutant)
    streamer_cls = find_attr(find_module(OUTPUT_STREAMER, mutant), "SchedulerOutputStreamer", mutant,
                             f"{OUTPUT_STREAMER}.SchedulerOutputStreamer")
    original = find_method(streamer_cls, "stream_output", mutant, ("reqs", "return_logprob", "skip_req"))

    def still_prefilling(req) -> bool:
        return (getattr(req, "extend_batch_idx", 0) > 1 and getattr(req, "decode_batch_idx", 0) == 0
                and not getattr(req, "finished_output", False))

    def stream_output(self, reqs, return_logprob, skip_req=None):
        if self.is_generation and any(still_prefilling(r) for r in reqs):
            reqs = [r for r in reqs if not still_prefilling(r)]  # MUTANT: the last chunk's result too
        return original(self, reqs, return_logprob, skip_req)

    replace_attr(streamer_cls, "stream_output", stream_output, original)
