"""Mutants of prefix-cache matching and insertion: how much of a prompt a
match may reuse, and where an insert starts counting the request's KV as a
duplicate of the tree's. Written blind (issue 34, item 5): the harness's
checks were not read, so ``expected`` is a guess of what should notice the
bug."""
from __future__ import annotations

import dataclasses
from typing import Any

from scripted_runtime.hooks.mutants.base import (ALL, SCHEDULE_BATCH, UNIFIED_RADIX_CACHE, mutant, find_attr,
                                                 find_method, find_module, replace_attr, scheduler_class)


# --- match: the whole prompt may be matched ---------------------------------------


@mutant("mut_prefix_match_takes_whole_prompt", topologies=ALL,
        summary="the prefix match may cover the whole prompt (max prefix = input length, not input length - 1)",
        expected="unknown (written blind); should show as a wrong first token or a crash for a prompt that is "
                 "fully cached (nothing left to extend)")
def _install_mut_prefix_match_takes_whole_prompt(scheduler_module: Any) -> None:
    """``Req._compute_max_prefix_len`` starts from ``input_len`` instead of
    ``input_len - 1``: a prompt that is entirely in the tree is matched
    entirely, and the request is admitted with nothing to extend. The first
    token is sampled from the logits of an extend that has no row for this
    request (in a batch with others: another request's last position; alone:
    an empty forward).

    Plausible: the ``- 1`` carries a comment about logprobs ("at most 1 less
    than the input length to enable logprob computation"), so it reads like
    a logprob-only concern that a cleanup can drop when no logprob is asked
    for; the logprob cap below it still applies.

    Trigger: a prompt whose every token is cached: the same prompt sent
    again after an earlier request with it ran its prefill (its prompt was
    inserted), or a prompt that is a prefix of an earlier prompt plus its
    output. The warm-up request meets an empty tree.

    Seen by (written blind): a wrong greedy first token for the fully cached
    request (the oracle's reference, the same prompt run alone, matches
    nothing), or a crash in the forward of a zero-length extend. All
    topologies."""
    mutant = "mut_prefix_match_takes_whole_prompt"
    scheduler_class(scheduler_module, mutant)
    req_cls = find_attr(find_module(SCHEDULE_BATCH, mutant), "Req", mutant, f"{SCHEDULE_BATCH}.Req")
    original = find_method(req_cls, "_compute_max_prefix_len", mutant, ("input_len",))

    def _compute_max_prefix_len(self, input_len: int) -> int:
        # MUTANT: `max_prefix_len = input_len - 1` became `input_len` (the later caps still apply)
        return original(self, input_len + 1)

    replace_attr(req_cls, "_compute_max_prefix_len", _compute_max_prefix_len, original)


# --- insert: duplicates counted from the request's own inserted length -------------


@mutant("mut_insert_dedup_starts_at_inserted_len", topologies=ALL,
        summary="an insert frees as duplicates the request's KV from its own inserted length, not its protected "
                "length (a matched prefix is freed while the tree keeps it)",
        expected="unknown (written blind); should show as a leak-check crash (KV both free and in the tree), "
                 "then wrong outputs for later prefix hits")
def _install_mut_insert_dedup_starts_at_inserted_len(scheduler_module: Any) -> None:
    """``UnifiedRadixCache.insert`` takes the request's own inserted length
    (``InsertParams.inserted_len``, ``req.kv.cache_inserted_len``) as the
    point where its KV stops being the tree's (``prev_prefix_len``, which
    ``checkpoint_into_tree`` sets from ``req.kv.cache_protected_len``). For a
    request that matched a prefix another request inserted, the protected
    length is the match and the inserted length is 0, so its first
    checkpoint treats the matched prefix (the tree's own slots, copied into
    its row by the match) as duplicates of themselves and frees them: the
    tree keeps nodes whose KV slots are back on the free list, and the next
    allocations overwrite that KV.

    Plausible: ``InsertParams(prev_prefix_len=req.kv.cache_protected_len,
    inserted_len=req.kv.cache_inserted_len, ...)`` are adjacent fields of the
    same record; a copy-paste of the second into the first is a one-word
    slip. Without a prefix hit the two lengths are equal at every checkpoint
    (the warm-up request, a chunked prompt's later chunks), so nothing
    changes there.

    Trigger: a request whose prompt starts with a prefix already in the tree
    (inserted by an earlier request), then its first checkpoint (the end of
    its prefill, or of its first chunk).

    Seen by (written blind): the pools no longer balance (free + cached
    exceeds the pool: SGLang's own idle leak check, strict by default,
    raises at the first idle iteration); requests that later hit the same
    prefix read KV that a newer request overwrote (wrong greedy outputs).
    All topologies."""
    mutant = "mut_insert_dedup_starts_at_inserted_len"
    scheduler_class(scheduler_module, mutant)
    cache_cls = find_attr(find_module(UNIFIED_RADIX_CACHE, mutant), "UnifiedRadixCache", mutant,
                          f"{UNIFIED_RADIX_CACHE}.UnifiedRadixCache")
    original = find_method(cache_cls, "insert", mutant, ("params",))

    def insert(self, params):
        if dataclasses.is_dataclass(params) and params.inserted_len < params.prev_prefix_len:
            # MUTANT: prev_prefix_len taken from the request's inserted length
            params = dataclasses.replace(params, prev_prefix_len=params.inserted_len)
        return original(self, params)

    replace_attr(cache_cls, "insert", insert, original)
