"""Mutants of chunked-prefill bookkeeping: the cached-token count a chunked
prompt reports, and which micro-batch adopts a request after its last chunk
under PP. Written blind as a second set (issue 34): the harness's checks and
what its explorer draws were not read, and the mutants were measured as
external patches before anyone read them, so ``expected`` is a guess of what
should notice the bug."""
from __future__ import annotations

from typing import Any, Optional

from scripted_runtime.hooks.mutants.base import (ALL, SCHEDULE_BATCH, mutant, find_attr, find_method, find_module,
                                                 replace_attr, scheduler_class)


# --- cached_tokens: every earlier chunk is counted as a cache hit -------------------


@mutant("mut_chunk_cached_tokens_inflated", topologies=ALL,
        summary="a chunked prompt's later chunks count the previous chunk as cached: cached_tokens over-reported",
        expected="unknown (written blind); should show as a wrong cached_tokens in a chunked prompt's answer "
                 "(its own earlier chunks counted as prefix-cache hits); the tokens are right")
def _install_mut_chunk_cached_tokens_inflated(scheduler_module: Any) -> None:
    """``ScheduleBatch.prepare_for_extend`` counts a request's cached
    tokens as ``prefix_len - already_computed`` per extend and then records
    how much of the sequence has been computed so far. Here it records the
    prefix this extend started from (``already_computed = pre_len``) instead
    of where the extend ended (``seq_len``). For a request prefilled in one
    extend nothing changes (its first extend counts the real prefix hit and
    no second extend follows). For a chunked prompt, every later chunk counts
    the previous chunk, which the request computed itself, as a cache hit:
    ``cached_tokens`` ends as the start of the last chunk instead of the
    prefix-cache hit.

    Plausible: "already computed" read as "what was already there before
    this extend"; the bookkeeping only matters from the second chunk on, and
    the retraction gate (``retracted_stain``) still holds. The mutant wraps
    ``prepare_for_extend`` and overwrites ``already_computed`` with the
    pre-extend prefix after the original ran, for exactly the requests the
    original updated: the same as changing that one line.

    Trigger: a prompt longer than one chunk (> 64 tokens on CPU, or a prefix
    hit followed by > 64 uncached tokens), not retracted. The warm-up prompt
    is one chunk.

    Seen by (written blind), as a user sees it: ``meta_info.cached_tokens``
    (and the cached-token details) of a chunked prompt over-reports: a cold
    150-token prompt reports 128 cached tokens instead of 0; with a prefix
    hit it reports the hit plus every chunk but the last. Output tokens are
    unchanged; no crash, no leak. All topologies."""
    mutant = "mut_chunk_cached_tokens_inflated"
    scheduler_class(scheduler_module, mutant)
    batch_cls = find_attr(find_module(SCHEDULE_BATCH, mutant), "ScheduleBatch", mutant,
                          f"{SCHEDULE_BATCH}.ScheduleBatch")
    original = find_method(batch_cls, "prepare_for_extend", mutant)

    def prepare_for_extend(self):
        pre_lens = [r.prefix_len for r in self.reqs]
        original(self)
        for req, pre_len in zip(self.reqs, pre_lens):
            if not req.retracted_stain:
                req.already_computed = pre_len  # MUTANT: was `req.already_computed = seq_len`

    replace_attr(batch_cls, "prepare_for_extend", prepare_for_extend, original)


# --- PP: the finished chunked request is adopted by a stale micro-batch -------------


@mutant("mut_pp_chunked_req_merged_twice", topologies=("pp4",),
        summary="PP: a chunked request is not excluded via last_batch.chunked_req, so a stale micro-batch also "
                "adopts it after its last chunk (decoded twice)",
        expected="unknown (written blind); should show as wrong outputs for a chunked prompt at pp4 (it decodes "
                 "in two micro-batches), likely a crash or a KV accounting failure once it finishes")
def _install_mut_pp_chunked_req_merged_twice(scheduler_module: Any) -> None:
    """``Scheduler.get_next_batch_to_run`` no longer excludes
    ``last_batch.chunked_req`` when it merges the last prefill batch into the
    running batch (the check under "In the context pipeline parallelism,
    after the last chunk, the current microbatch still track outdated
    chunked_req"). Under PP the chunks of one prompt run in consecutive
    micro-batches; when micro-batch i comes round again, its ``last_batch``
    is the batch of an earlier (middle) chunk, whose ``chunked_req`` is the
    request, while ``self.chunked_req`` is already None because the last
    chunk was admitted in micro-batch j. Without the exclusion the request
    (not finished) is merged into micro-batch i's running batch as well as
    into j's: it decodes in two micro-batches, the stale one starting from
    its middle-chunk seq_len.

    Plausible: at pp=1 the line is dead code (``self.chunked_req`` already
    excludes the chunked request, and an aborted or retracted one is
    finished or gone), so it reads as a redundant leftover. The mutant wraps
    ``get_next_batch_to_run`` and hides ``last_batch.chunked_req`` for the
    duration of the call (restored after; nothing else in the call reads
    it): the same as deleting that check. pp=1 behaviour is unchanged.

    Trigger: PP (pp4) and a prompt longer than one chunk (> 64 tokens), so
    that its chunks land in different micro-batches. The warm-up is one
    chunk.

    Seen by (written blind), as a user sees it (PP internals not traced end
    to end): the chunked request's answer is wrong: extra or garbled tokens
    (it gets tokens from two decode streams, one of them writing KV at the
    wrong positions of its row) and it reaches max_new_tokens early; likely
    a scheduler crash when it finishes in one micro-batch while the other
    still carries it (a second release_kv_cache of a released request), or a
    KV accounting failure at idle. Only pp4."""
    mutant = "mut_pp_chunked_req_merged_twice"
    cls = scheduler_class(scheduler_module, mutant)
    original = find_method(cls, "get_next_batch_to_run", mutant, ("running_batch", "last_batch"))

    def get_next_batch_to_run(self, running_batch, last_batch):
        stale: Optional[Any] = getattr(last_batch, "chunked_req", None) if last_batch is not None else None
        if stale is not None:
            last_batch.chunked_req = None  # MUTANT: last_batch.chunked_req is not excluded from the merge
        try:
            return original(self, running_batch, last_batch)
        finally:
            if stale is not None:
                last_batch.chunked_req = stale

    replace_attr(cls, "get_next_batch_to_run", get_next_batch_to_run, original)
