"""Mutants of admission and retraction under KV pressure: what a prefill
pass charges for the requests it admits, what a retraction gives back, and
what a retracted request resumes with. Written blind (issue 34, item 5): the
harness's checks were not read, so ``expected`` is a guess of what should
notice the bug."""
from __future__ import annotations

from typing import Any

from scripted_runtime.hooks.mutants.base import (ALL, PREFILL_BUDGET, SCHEDULE_BATCH, check_copied_body, mutant,
                                                 find_attr, find_method, find_module, missing_target, replace_attr,
                                                 scheduler_class)

# Digest of the 0.5.23 body that mut_fill_ids_refresh_discards_append copies
# (normalized source: dedented, blank lines dropped, trailing space stripped).
REFRESH_FILL_IDS_DIGEST = "8188ca6efbac1fe1"


# --- admission: the admitted extend is not charged --------------------------------


@mutant("mut_prefill_budget_ignores_admitted_extend", topologies=ALL,
        summary="a prefill pass charges its admitted requests' decode headroom but not their extend (over-admission)",
        expected="unknown (written blind); should show as a crash (SGLang's own 'Prefill out of memory') "
                 "under KV pressure")
def _install_mut_prefill_budget_ignores_admitted_extend(scheduler_module: Any) -> None:
    """``PrefillBudget.reserve`` (what ``PrefillAdder`` charges for each
    request it admits in one prefill pass) adds only the request's decode
    headroom (``max_new_tokens``) to the total offset and nothing to the
    current one: the extend tokens, the page and the extra slots the request
    will allocate are not reserved. Every later candidate of the same pass
    is checked against KV that an earlier admission already spoke for, so
    the pass can admit more extend than the pool can give; the batch's
    allocation then fails.

    Plausible: "``available_size()`` already reflects what was admitted" is
    true only after the batch allocates, which happens after the whole pass;
    a change that stops charging the immediate part (keeping the decode
    reservation, which is not allocated yet) reads as removing a double
    count. Without KV pressure nothing changes: one request, or several that
    fit together.

    Trigger: KV pressure (a small pool, or most of it held by running
    requests) and two or more waiting requests admitted in one prefill pass
    whose extends fit one by one but not together (the chunk budget, 64
    tokens on CPU, bounds a pass's extend).

    Seen by (written blind): a crash in ``alloc_token_slots`` (SGLang's own
    fail-loud "Prefill out of memory", RuntimeError) at that batch; with
    some slack left, more decode retractions than before. All topologies."""
    mutant = "mut_prefill_budget_ignores_admitted_extend"
    scheduler_class(scheduler_module, mutant)
    budget_cls = find_attr(find_module(PREFILL_BUDGET, mutant), "PrefillBudget", mutant,
                           f"{PREFILL_BUDGET}.PrefillBudget")
    original = find_method(budget_cls, "reserve", mutant, ("extend_input_len", "max_new_tokens", "extra_tokens"))

    def reserve(self, extend_input_len, max_new_tokens, *, extra_tokens=0, chunk_limit=None,
                is_chunked_continuation=False):
        # MUTANT: `immediate = extend + page + extra` is charged to neither offset; the original's
        # immediate part is zero when it is handed no extend and `-page_size` extra tokens.
        return original(self, 0, max_new_tokens, extra_tokens=-self.page_size, chunk_limit=chunk_limit,
                        is_chunked_continuation=is_chunked_continuation)

    replace_attr(budget_cls, "reserve", reserve, original)


# --- retraction: the request's KV is not given back -------------------------------


@mutant("mut_retract_keeps_kv", topologies=ALL,
        summary="a retraction releases the request's row and lock but never frees its own KV slots (they leak)",
        expected="unknown (written blind); should show as a KV leak (SGLang's own idle leak check crashes, or the "
                 "pool never drains)")
def _install_mut_retract_keeps_kv(scheduler_module: Any) -> None:
    """``release_req`` (``schedule_batch``; every retraction goes through it:
    ``retract_decode`` under decode KV pressure, ``retract_all`` for
    ``pause_generation(retract)``) marks the request's whole KV as protected
    by the tree (``cache_protected_len`` raised to its owned length) before
    the release, as a checkpoint would have, but no checkpoint runs
    (``checkpoint=False``): ``release_kv_cache`` frees nothing past the
    protected length, the tree never got those slots, and
    ``reset_for_retract`` then forgets the record. Every KV slot the request
    computed beyond what the tree holds (its decoded tokens, an uncached
    prompt tail) leaks.

    Plausible: a half-done take on the TODO above the release ("for
    preempted requests, we may want to insert into the tree"): the
    bookkeeping of an insert is added and the insert itself stays switched
    off because "we need the space instantly".

    Trigger: a retraction of a request that holds KV the tree does not: a
    pause_generation(retract) while a request decodes, or decode KV pressure
    (``retract_decode``). The warm-up request is never retracted.

    Seen by (written blind): the pool no longer balances once the engine is
    idle (SGLang's own idle leak check, strict by default, raises); with many
    retractions, the pool runs dry. All topologies."""
    mutant = "mut_retract_keeps_kv"
    scheduler_class(scheduler_module, mutant)
    sb = find_module(SCHEDULE_BATCH, mutant)
    original = find_attr(sb, "release_req", mutant, f"{SCHEDULE_BATCH}.release_req")
    find_attr(sb, "retract_all", mutant, f"{SCHEDULE_BATCH}.retract_all")
    if getattr(sb.ScheduleBatch, "release_req", None) is None:
        raise missing_target(mutant, f"{SCHEDULE_BATCH}.ScheduleBatch.release_req")

    def release_req(*, req, **kwargs):
        if req.kv.holds_kv and not req.finished():
            # MUTANT: the retracted KV is counted as the tree's, though nothing inserted it
            req.kv.cache_protected_len = max(req.kv.cache_protected_len, req.owned_kv_len())
        return original(req=req, **kwargs)

    replace_attr(sb, "release_req", release_req, original)


# --- resume: the refresh of the fill ids is discarded ------------------------------


@mutant("mut_fill_ids_refresh_discards_append", topologies=ALL,
        summary="refresh_fill_ids builds prompt + new output but discards it: a resumed request re-prefills its prompt only",
        expected="unknown (written blind); should show as wrong outputs after a retraction (the request restarts "
                 "from its prompt, keeping the tokens it already has)")
def _install_mut_fill_ids_refresh_discards_append(scheduler_module: Any) -> None:
    """``Req.refresh_fill_ids`` computes the append of the new output tokens
    as ``fill_ids + output_ids[n:]`` and discards the result (it was
    ``fill_ids.extend(output_ids[n:])``): the fill ids keep what they had at
    the request's first admission, the prompt. The full rebuild (a fresh
    request) still works. A retracted request, resumed through
    ``init_next_round_input``, is matched and prefilled as its prompt only
    while its ``output_ids`` keep the tokens it generated: its next token is
    sampled from the prompt alone and appended after them, and it decodes on
    from a context that lacks its own output. A finished request inserts
    only its prompt into the tree (its output tokens are not cached).

    Plausible: the classic ``a + b`` for ``a.extend(b)`` (``array`` supports
    both); the request that starts fresh and the one that finishes behave
    the same to the eye (the cached output is an optimisation), so only a
    resume shows it. The body is copied from 0.5.23 (checked by source
    digest) with that one line changed.

    Trigger: a retraction of a request that has generated tokens
    (pause_generation(retract), or decode KV pressure), then its resume. The
    warm-up request is never retracted.

    Seen by (written blind): the resumed request's greedy output differs
    from the same prompt run alone (after the retraction it repeats its
    beginning); no leak, no crash. All topologies."""
    mutant = "mut_fill_ids_refresh_discards_append"
    scheduler_class(scheduler_module, mutant)
    req_cls = find_attr(find_module(SCHEDULE_BATCH, mutant), "Req", mutant, f"{SCHEDULE_BATCH}.Req")
    original = find_method(req_cls, "refresh_fill_ids", mutant)
    check_copied_body(original, REFRESH_FILL_IDS_DIGEST, mutant, "Req.refresh_fill_ids")

    def refresh_fill_ids(self) -> None:
        """Keep full_untruncated_fill_ids == origin_input_ids + output_ids by
        appending only the new output tokens (MUTANT: the append is lost)."""
        n_have_output = len(self.full_untruncated_fill_ids) - len(self.origin_input_ids)
        if (
            self.full_untruncated_fill_ids is not self.origin_input_ids
            and 0 <= n_have_output <= len(self.output_ids)
        ):
            self.full_untruncated_fill_ids + self.output_ids[n_have_output:]  # MUTANT: was .extend(...)
        else:
            self.full_untruncated_fill_ids = self.origin_input_ids + self.output_ids

    replace_attr(req_cls, "refresh_fill_ids", refresh_fill_ids, original)
