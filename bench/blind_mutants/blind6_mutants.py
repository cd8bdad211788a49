"""Blind mutant set 6: SGLang 0.5.23's scheduler, across six families.

Kept as external patches, like the third, fourth and fifth blind sets; run one
with, for example:

    scripted-runtime mutate --topology pp1-overlap --no-corpus \\
        --patch bench/blind_mutants/blind6_mutants.py:blind6_ignore_eos_keeps_stop_ids

Written by a helper author in one sitting; not edited since.

Written from SGLang's own source only (the installed 0.5.23 package), without
reading the harness's checks, contracts, invariants, oracle, explorer, grammar,
strategies, corpus, tests, scenarios or docs, and without looking at the
built-in mutants or at the earlier blind sets beyond their file format (and
blind5's own docstring, read to stay off its spots). Each mutant is a ``Patch``
whose ``install(scheduler_module)`` monkeypatches one spot of SGLang in the
scheduler process, wrapping or replacing the original (``__wrapped__`` keeps
it); where an install copies an SGLang function body to change a line, it pins
that body with ``check_copied_body``. Ten mutants, at most two per family:

1. request semantics
   * ``blind6_ignore_eos_keeps_stop_ids``: ``Req._check_token_based_finish``
     lets ``ignore_eos`` silence only the EOS ids; the request's own
     ``stop_token_ids`` still finish it, so an ``ignore_eos`` request stops at a
     stop token (finish_reason matched token, output shorter than
     max_new_tokens) instead of running to its length.
   * ``blind6_stop_str_window_short``: ``Req._stop_match_tail_len`` drops the
     one-token slack of the stop-string tail window, so a stop string whose
     text straddles one more token than its standalone tokenization is never
     seen: the request runs past it to its length (and a stream no longer holds
     back that stop string's prefix).
2. KV slot mapping / req_to_token content
   * ``blind6_prefix_row_not_written``: ``allocation.write_cache_indices`` (the
     req_to_token writer of ``alloc_for_extend``) writes only the extend half
     ``[prefix_len, seq_len)`` of each row; a fresh row admitted with a radix
     prefix hit keeps its previous occupant's slots in ``[0, prefix_len)``.
   * ``blind6_retract_keep_order_lost``: ``ScheduleBatch.filter_batch`` gathers
     the row tensors with ``keep_indices`` sorted but keeps ``reqs`` in the
     caller's order; ``retract_decode`` passes its survivors in retraction
     order, so after a retraction requests and rows (req_pool_indices,
     seq_lens) no longer line up.
3. radix / prefix cache
   * ``blind6_prefix_hit_not_protected``: ``Req.init_next_round_input`` no
     longer marks a radix prefix hit as tree-owned (``kv.cache_protected_len``
     stays 0), so the request's first checkpoint/finish insert treats the
     matched prefix slots as its own duplicates and frees slots the tree still
     holds.
   * ``blind6_admission_pin_leaked``: ``PrefillAdder._lock_node`` (the
     temporary pin ``add_one_req`` puts on a candidate's matched prefix while it
     sizes the admission) never unlocks, so every prefix node a candidate
     matched stays locked (protected, never evictable) after its requests end.
4. admission under KV pressure / prefill budget
   * ``blind6_chunk_budget_not_charged``: ``PrefillAdder._update_prefill_budget``
     no longer charges ``rem_chunk_tokens``, so one prefill pass can start two
     chunked prompts (the first is cut off mid-prompt and decodes from a
     truncated context) or start a new chunked prompt beside a continuing one
     (the scheduler's single-chunked-request assert fails).
5. control operations
   * ``blind6_weight_version_skips_waiting``: ``Scheduler.record_weight_version_change``
     records the old version's span only for in-flight requests, not the
     waiting queue, so requests parked there by a retract-mode pause report
     every output token under the new weight version.
   * ``blind6_weight_checksum_stale``: ``weight_checker._hash_tensor`` caches
     each tensor's digest by its storage; in-place weight updates keep the
     storage, so a checksum query after an update returns the pre-update
     checksums.
6. loop bookkeeping (overlap / pipeline-parallel)
   * ``blind6_finished_filter_only_on_merge`` (overlap loop and pp4):
     ``Scheduler.get_next_batch_to_run`` drops finished requests from the
     running batch only on a step that merged a prefill batch; a prefill-only
     request (max_new_tokens 0) that finishes after its merge stays in the
     running batch, so the server never goes idle again (a flush is refused).

Every install raises ``PatchError`` ("... written against SGLang 0.5.23") when
its target is missing or a copied body differs. None uses randomness or timing.
None changes what the server's warm-up request does (a single short /generate,
temperature 0, max_new_tokens 8, no abort, pause, flush, session, chunking,
prefix hit, stop string, ignore_eos, retraction, concurrency or memory
pressure): each needs a trigger the warm-up does not have, named in its install
function's docstring. Most are silent (wrong output or metadata, wrong answer
to a control request, cache or KV state corrupted without SGLang's own idle
check noticing); ``blind6_chunk_budget_not_charged`` may crash the scheduler
(an assert) and ``blind6_retract_keep_order_lost`` may end in one.
"""
from __future__ import annotations

import contextlib
from typing import Any

from scripted_runtime.hooks.mutants.base import (
    check_copied_body,
    find_attr,
    find_method,
    find_module,
    replace_attr,
    scheduler_class,
)
from scripted_runtime.hooks.patch_base import Patch

RELEASE = "0.5.23"
ALL = ("pp1-overlap", "pp1-normal", "pp4")
OVERLAP_AND_PP = ("pp1-overlap", "pp4")

SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch"
SCHEDULE_POLICY = "sglang.srt.managers.schedule_policy"
ALLOCATION = "sglang.srt.mem_cache.allocation"
WEIGHT_CHECKER = "sglang.srt.utils.weight_checker"


def _req_class(name: str) -> type:
    batch_module = find_module(SCHEDULE_BATCH, name)
    return find_attr(batch_module, "Req", name, f"{SCHEDULE_BATCH}.Req")


# --- 1. request semantics: ignore_eos silences only EOS, not stop_token_ids ----


def _install_ignore_eos_keeps_stop_ids(scheduler_module: Any) -> None:
    """``Req._check_token_based_finish`` in 0.5.23 returns False at once for an
    ``ignore_eos`` request: no token id (EOS, the model's extra stop ids, nor the
    request's own ``stop_token_ids``) finishes it, and it runs to
    ``max_new_tokens``. The mutant moves the ``ignore_eos`` guard onto the EOS
    checks only, so the user's ``stop_token_ids`` still match.

    Plausible: "ignore_eos" reads as "ignore the EOS token"; narrowing the early
    return to the EOS branch while restructuring the loop is a one-line slip,
    and it looks like a fix. Trigger: a request with ``ignore_eos=True`` and
    ``stop_token_ids`` containing a token the model emits before
    ``max_new_tokens``. The user sees it stop early with
    finish_reason ``{"type": "stop", "matched": <id>}`` and a short output
    instead of a length finish with all ``max_new_tokens`` tokens. Without
    ``ignore_eos`` nothing changes (the warm-up sets neither field)."""
    name = "blind6_ignore_eos_keeps_stop_ids"
    batch_module = find_module(SCHEDULE_BATCH, name)
    req_cls = _req_class(name)
    original = find_method(req_cls, "_check_token_based_finish", name, ("new_accepted_tokens",))
    check_copied_body(original, "2cb5a0733caf7a14", name, "Req._check_token_based_finish")
    finish_matched_token = find_attr(batch_module, "FINISH_MATCHED_TOKEN", name,
                                     f"{SCHEDULE_BATCH}.FINISH_MATCHED_TOKEN")

    def _check_token_based_finish(self, new_accepted_tokens):
        # MUTANT: no early return for ignore_eos; it only gates the EOS checks.
        ignore_eos = self.sampling_params.ignore_eos

        # Check stop token ids
        matched_eos = False

        for i, token_id in enumerate(new_accepted_tokens):
            if self.sampling_params.stop_token_ids:
                matched_eos |= token_id in self.sampling_params.stop_token_ids
            if not ignore_eos:
                if self.eos_token_ids:
                    matched_eos |= token_id in self.eos_token_ids
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


blind6_ignore_eos_keeps_stop_ids = Patch(
    name="blind6_ignore_eos_keeps_stop_ids",
    summary="an ignore_eos request still finishes on one of its stop_token_ids: it stops early with a "
            "matched-token finish instead of running to max_new_tokens",
    install=_install_ignore_eos_keeps_stop_ids,
    topologies=ALL,
    expected="unknown (written blind): an ignore_eos request with stop_token_ids whose output is shorter "
             "than max_new_tokens and whose finish_reason is a matched stop token, not length",
)


# --- 1. request semantics: the stop-string tail window loses its one-token slack ----


def _install_stop_str_window_short(scheduler_module: Any) -> None:
    """``Req._stop_match_tail_len`` sizes the window of trailing output tokens
    that ``tail_str`` decodes to look for stop strings (and that the streamer's
    ``check_match_stop_str_prefix`` uses to hold back a partial stop string):
    ``stop_str_max_len + 1`` tokens, where ``stop_str_max_len`` is the longest
    stop string's token count when tokenized alone. The ``+ 1`` covers a stop
    string whose text starts inside the token before its own first token. The
    mutant drops that slack (for stop regexes too).

    Plausible: the window "is" the longest stop string, the extra token looks
    like an off-by-one to clean up. Trigger: a request with ``stop`` strings
    whose match in the output straddles one token more than the string's own
    tokenization (e.g. a one-token stop string that the output produces as the
    end of one token plus the start of the next, or a stop string starting in
    the middle of a token). The stop is never detected: the request runs on to
    max_new_tokens (or another stop) with the stop string inside its text and
    finish_reason length. With no stop strings ``tail_str`` returns "" before
    this is reached (the warm-up has none)."""
    name = "blind6_stop_str_window_short"
    req_cls = _req_class(name)
    original = find_method(req_cls, "_stop_match_tail_len", name, ("new_accepted_len",))
    check_copied_body(original, "2533d619cd92033b", name, "Req._stop_match_tail_len")

    def _stop_match_tail_len(self, new_accepted_len):
        # MUTANT: no "+ 1" token of slack in front of the longest stop string.
        max_len_tail_str = max(
            self.sampling_params.stop_str_max_len,
            self.sampling_params.stop_regex_max_len,
        )
        # Cover all newly accepted tokens so an early stop string is not missed
        # when speculative decoding accepts multiple tokens per step.
        return min(
            max_len_tail_str + max(new_accepted_len - 1, 0), len(self.output_ids)
        )

    replace_attr(req_cls, "_stop_match_tail_len", _stop_match_tail_len, original)


blind6_stop_str_window_short = Patch(
    name="blind6_stop_str_window_short",
    summary="the stop-string tail window is one token short: a stop string that straddles one more token "
            "than its own tokenization is missed and the request runs past it",
    install=_install_stop_str_window_short,
    topologies=ALL,
    expected="unknown (written blind): a request with stop strings whose output contains a stop string "
             "and goes on past it (length finish) instead of stopping there",
)


# --- 2. KV slot mapping: a prefix-hit row's prefix half is never written ----


def _install_prefix_row_not_written(scheduler_module: Any) -> None:
    """``alloc_for_extend`` builds each request's prefix slot list
    (``_prefix_kv_indices``: the row it already holds for a continuing chunk,
    the radix path for a new request with a prefix hit) and calls
    ``write_cache_indices`` to write ``[0, prefix_len)`` from it and
    ``[prefix_len, seq_len)`` from the freshly allocated slots into
    req_to_token. The mutant replaces the writer by its per-request loop that
    writes only the extend half.

    Plausible: for a continuing chunk the prefix half is a no-op rewrite of the
    row itself, and "the prefix is already there" is easy to generalize in a
    refactor that skips redundant writes. It is wrong for a row taken fresh from
    the free list: it still holds its previous occupant's slots. Trigger: a
    request admitted with a radix prefix hit (or a retracted request resumed
    with one) onto a row whose last occupant had different tokens there, e.g.
    prompt A, then an unrelated prompt B (reuses A's row, LIFO), then a prompt
    sharing A's prefix. Its attention then reads B's (or freed) KV for the
    shared prefix: wrong output tokens, and the KV it computes and publishes for
    its own tokens is conditioned on that wrong prefix, so later hits on it
    inherit the error. A sequential repeat onto the same row hides it (the stale
    slots are the tree's own); the warm-up has no prefix hit."""
    name = "blind6_prefix_row_not_written"
    scheduler_class(scheduler_module, name)
    allocation = find_module(ALLOCATION, name)
    original = find_attr(allocation, "write_cache_indices", name, f"{ALLOCATION}.write_cache_indices")
    check_copied_body(original, "32f2f36d443012ba", name, "allocation.write_cache_indices")

    def write_cache_indices(
        out_cache_loc,
        req_pool_indices_tensor,
        req_pool_indices_cpu,
        prefix_lens_tensor,
        prefix_lens_cpu,
        seq_lens_tensor,
        seq_lens_cpu,
        extend_lens_tensor,
        extend_lens_cpu,
        prefix_tensors,
        req_to_token_pool,
    ):
        pt = 0
        for i in range(req_pool_indices_cpu.shape[0]):
            req_idx = req_pool_indices_cpu[i].item()
            prefix_len = prefix_lens_cpu[i].item()
            seq_len = seq_lens_cpu[i].item()
            extend_len = extend_lens_cpu[i].item()

            # MUTANT: [0, prefix_len) is left as the row already has it.
            req_to_token_pool.write(
                (req_idx, slice(prefix_len, seq_len)),
                out_cache_loc[pt : pt + extend_len],
            )
            pt += extend_len

    replace_attr(allocation, "write_cache_indices", write_cache_indices, original)


blind6_prefix_row_not_written = Patch(
    name="blind6_prefix_row_not_written",
    summary="alloc_for_extend writes only the extend half of each req_to_token row: a fresh row admitted "
            "with a radix prefix hit keeps its previous occupant's slots for the prefix",
    install=_install_prefix_row_not_written,
    topologies=ALL,
    expected="unknown (written blind): a prefix-hit request whose req_to_token row prefix differs from "
             "the radix path it matched; wrong output tokens for that request",
)


# --- 2. KV slot mapping: retraction's survivors lose their request/row pairing ----


def _install_retract_keep_order_lost(scheduler_module: Any) -> None:
    """``ScheduleBatch.retract_decode`` keeps the survivors as
    ``filter_batch(keep_indices=sorted_indices)``, where ``sorted_indices`` is
    in retraction-preference order (most output first, then shortest prompt),
    not ascending. ``filter_batch`` gathers ``reqs`` and every row tensor
    (req_pool_indices, seq_lens, sampling info, ...) with the same indices, so
    the pairing survives any order. The mutant gathers the row tensors with the
    indices sorted ascending but keeps ``reqs`` in the caller's order.

    Plausible: sorting the keep list looks like a harmless normalization for
    the device gather (a monotonic index), and every other caller passes
    ascending indices, so only retraction notices. Trigger: a decode batch
    retracted under KV pressure (or SGLANG_TEST_RETRACT) that keeps at least two
    requests in non-ascending order, e.g. requests admitted together with
    different prompt lengths. Afterwards request i is paired with another
    request's row: output tokens land on the wrong requests, finish/length
    checks run on the wrong outputs, and a finished request's filter drops a row
    that another request still decodes into (slots freed twice or leaked). The
    warm-up never retracts; filters with ascending or no indices are
    unchanged."""
    name = "blind6_retract_keep_order_lost"
    scheduler_class(scheduler_module, name)
    batch_module = find_module(SCHEDULE_BATCH, name)
    batch_cls = find_attr(batch_module, "ScheduleBatch", name, f"{SCHEDULE_BATCH}.ScheduleBatch")
    original = find_method(batch_cls, "filter_batch", name, ("reqs_to_exclude", "keep_indices"))

    def filter_batch(self, reqs_to_exclude=None, keep_indices=None):
        if keep_indices is None or list(keep_indices) == sorted(keep_indices):
            return original(self, reqs_to_exclude=reqs_to_exclude, keep_indices=keep_indices)
        reqs = self.reqs
        # MUTANT: rows are gathered in ascending order ...
        original(self, keep_indices=sorted(keep_indices))
        # ... but the requests stay in the order the caller listed them.
        self.reqs = [reqs[i] for i in keep_indices]

    replace_attr(batch_cls, "filter_batch", filter_batch, original)


blind6_retract_keep_order_lost = Patch(
    name="blind6_retract_keep_order_lost",
    summary="after a decode retraction the surviving requests and their req_to_token rows/seq_lens are "
            "paired out of order (filter_batch sorts the row gather, not the request list)",
    install=_install_retract_keep_order_lost,
    topologies=ALL,
    expected="unknown (written blind): after a retraction, requests whose outputs continue another "
             "request's text; KV slots freed twice or leaked (a leak check or an allocator crash)",
)


# --- 3. radix cache: a prefix hit is not marked tree-owned, so it is freed as a duplicate ----


def _install_prefix_hit_not_protected(scheduler_module: Any) -> None:
    """``Req.init_next_round_input`` matches the request against the radix tree
    and, when the match result carries no ``cache_protected_len`` (the FULL-only
    unified cache never sets one), records the matched length as the part of the
    request's row the tree owns: ``kv.cache_protected_len = prefix_len``. The
    tree insert of a checkpoint or finish (``checkpoint_into_tree``) passes it
    as ``prev_prefix_len``; only tokens past it that the tree already holds are
    the request's own duplicate slots and are freed. The mutant drops that
    fallback: ``cache_protected_len`` stays where it was (0 for a new or a
    retracted request).

    Plausible: a missed branch; the match result "owns" that field, and the
    fallback looks redundant next to ``match_kv_cache`` setting it when the
    result has one. Trigger: any request admitted with a radix prefix hit (a
    prompt sharing a prefix with an earlier request, a repeated prompt, a
    resumed request whose prompt the tree holds). At its first chunk
    checkpoint or at its finish the insert frees the matched prefix slots as
    duplicates, but they are the tree's own slots: the tree keeps nodes whose
    KV slots are back on the free list, later allocations overwrite them (wrong
    outputs for later hits on that prefix), and a later eviction frees them a
    second time (the free count runs past the pool size). The warm-up has no
    prefix hit (its fallback would write 0 anyway)."""
    name = "blind6_prefix_hit_not_protected"
    batch_module = find_module(SCHEDULE_BATCH, name)
    req_cls = _req_class(name)
    original = find_method(req_cls, "init_next_round_input", name, ("tree_cache", "cow_mamba"))
    check_copied_body(original, "4896b34fa11806c6", name, "Req.init_next_round_input")
    logger = find_attr(batch_module, "logger", name, f"{SCHEDULE_BATCH}.logger")
    array = find_attr(batch_module, "array", name, f"{SCHEDULE_BATCH}.array")
    match_kv_cache = find_attr(batch_module, "match_kv_cache", name, f"{SCHEDULE_BATCH}.match_kv_cache")

    def init_next_round_input(self, tree_cache=None, cow_mamba=None):
        if self.is_dllm():
            self._init_fill_ids_for_dllm()
        else:
            self.refresh_fill_ids()

        input_len = len(self.full_untruncated_fill_ids)

        # Streaming sessions reuse committed KV from the session slot, so
        # custom logprob_start_len is not supported — override to -1.
        if (
            self.session is not None
            and self.session.streaming
            and self.return_logprob
            and self.logprob_start_len >= 0
        ):
            logger.warning(
                "logprob_start_len=%d is not supported for streaming sessions "
                "and will be ignored (rid=%s). Only new-token logprobs are returned.",
                self.logprob_start_len,
                self.rid,
            )
            self.logprob_start_len = -1

        # Pass the full array with a raw-token cap (limit) instead of slicing,
        # avoiding an O(context) copy per prefill-batch build.
        token_ids_to_match = self.full_untruncated_fill_ids
        key_limit = self._compute_max_prefix_len(input_len)

        # Disable prefix caching when embed overrides are present: same token IDs
        # with different override vectors must not share cached KV values.
        if self.positional_embed_overrides is not None:
            token_ids_to_match = array("q")
            key_limit = None

        if tree_cache is not None:
            if cow_mamba is None:
                cow_mamba = tree_cache.supports_mamba()
            match_result = match_kv_cache(
                self,
                tree_cache,
                token_ids_to_match,
                cow_mamba=cow_mamba,
                max_prefix_len=key_limit,
            )
            self.mamba_branching_seqlen = match_result.mamba_branching_seqlen
            # MUTANT: no fallback `self.kv.cache_protected_len = self.prefix_len`
            # when the match result carries no cache_protected_len.

            if self.is_dllm():
                self._update_block_offset_for_dllm()

        if self.is_dllm():
            self.determine_dllm_phase()

        if (
            self.is_retracted
            and self.multimodal_inputs is not None
            and self.multimodal_inputs.mrope_positions is not None
        ):
            from sglang.srt.managers.mm_utils import (
                extend_mrope_positions_for_retracted_request,
            )

            self.multimodal_inputs.mrope_positions = (
                extend_mrope_positions_for_retracted_request(
                    self.multimodal_inputs.mrope_positions, len(self.output_ids)
                )
            )

    replace_attr(req_cls, "init_next_round_input", init_next_round_input, original)


blind6_prefix_hit_not_protected = Patch(
    name="blind6_prefix_hit_not_protected",
    summary="a radix prefix hit is not recorded as tree-owned (cache_protected_len stays 0): the "
            "request's checkpoint/finish insert frees the shared prefix slots the tree still holds",
    install=_install_prefix_hit_not_protected,
    topologies=ALL,
    expected="unknown (written blind): after a prefix hit, tree nodes whose KV slots are on the free "
             "list (free + cached exceeds the pool; a leak/double-free check), then wrong outputs for "
             "later hits on that prefix",
)


# --- 3. radix cache: the admission pin on a candidate's prefix is never released ----


def _install_admission_pin_leaked(scheduler_module: Any) -> None:
    """``PrefillAdder.add_one_req`` sizes a candidate inside
    ``with self._lock_node(req.last_node):``, a temporary lock on the matched
    prefix so that the budget does not count the candidate's own prefix as
    evictable; ``_commit_prefill_admission`` then takes the request's real lock
    (``req.lock``), released when the request ends. The mutant's
    ``_lock_node`` takes the temporary lock and drops its receipt instead of
    unlocking it on exit (the host-side pin, HiCache only, is still released).

    Plausible: the unlock sits in a nested ``finally`` of the context manager;
    flattening it (or keeping only the outer host-lock ``finally``) loses it,
    and nothing fails at once because the request holds its own lock anyway.
    Trigger: any candidate with a radix prefix hit that the adder evaluates
    (each scheduling pass it waits, once more); candidates without a hit lock
    only the root, which holds no tokens (the warm-up's case). Every matched
    prefix node stays locked after its requests finish: the tree reports it
    protected while nothing runs, it is never evicted, and under KV pressure
    the pool fills with pinned prefixes until admission stalls (only a flush
    clears it)."""
    name = "blind6_admission_pin_leaked"
    scheduler_class(scheduler_module, name)
    policy_module = find_module(SCHEDULE_POLICY, name)
    adder_cls = find_attr(policy_module, "PrefillAdder", name, f"{SCHEDULE_POLICY}.PrefillAdder")
    original = find_method(adder_cls, "_lock_node", name, ("last_node", "lock_host"))
    check_copied_body(original, "5603cdeb8a293bbb", name, "PrefillAdder._lock_node")

    @contextlib.contextmanager
    def _lock_node(self, last_node, *, lock_host=False):
        host_lock_params = (
            self.tree_cache.inc_host_lock_ref(last_node).to_dec_params()
            if lock_host
            else None
        )
        try:
            # MUTANT: the pin's TreeLock is dropped; nothing unlocks it.
            self.tree_cache.lock(last_node)
            yield None
        finally:
            if host_lock_params is not None:
                self.tree_cache.dec_host_lock_ref(last_node, host_lock_params)

    replace_attr(adder_cls, "_lock_node", _lock_node, original)


blind6_admission_pin_leaked = Patch(
    name="blind6_admission_pin_leaked",
    summary="the temporary lock add_one_req puts on a candidate's matched prefix is never released: "
            "prefix-hit nodes stay locked (protected, unevictable) after their requests end",
    install=_install_admission_pin_leaked,
    topologies=ALL,
    expected="unknown (written blind): radix nodes still locked / protected tokens at idle after "
             "prefix-hit requests finished; under KV pressure admission stalls behind pinned prefixes",
)


# --- 4. admission: the chunked-prefill budget is never charged ----


def _install_chunk_budget_not_charged(scheduler_module: Any) -> None:
    """``PrefillAdder._update_prefill_budget`` charges each admitted request
    (a continuing chunk, a whole prompt, a new chunk) against the pass's
    budgets: the KV reservation, ``rem_input_tokens`` and, with chunked prefill
    on, ``rem_chunk_tokens`` (chunked_prefill_size for the pass). Only a
    request that does not fit the remaining chunk budget is cut into a chunk,
    and ``budget_state`` ends the pass once the chunk budget is spent, which is
    what keeps one pass to at most one chunked request. The mutant restores
    ``rem_chunk_tokens`` after the charge (as if its decrement were gone).

    Plausible: a one-line omission in a function that updates four budgets,
    and single-request tests never notice. Trigger (chunked prefill on, size
    64 here): two prompts longer than the chunk size admitted in one pass, or a
    long prompt arriving while another one is mid-chunking. In the first case
    both are cut into chunks but the scheduler tracks only the last one: the
    other one's prefill stops at its first chunk, it samples from a truncated
    prompt and decodes from there (wrong output, and its finish publishes KV
    that does not match its prompt tokens). In the second case
    ``_get_new_batch_prefill_raw`` asserts that no chunked request is pending
    and the scheduler dies. The warm-up is one short prompt."""
    name = "blind6_chunk_budget_not_charged"
    scheduler_class(scheduler_module, name)
    policy_module = find_module(SCHEDULE_POLICY, name)
    adder_cls = find_attr(policy_module, "PrefillAdder", name, f"{SCHEDULE_POLICY}.PrefillAdder")
    original = find_method(adder_cls, "_update_prefill_budget", name,
                           ("prefix_len", "extend_input_len", "max_new_tokens"))
    # The wrapper relies on this body touching rem_chunk_tokens only to charge it.
    check_copied_body(original, "1055b8a6ae3aa864", name, "PrefillAdder._update_prefill_budget")

    def _update_prefill_budget(self, *args, **kwargs):
        rem_chunk_tokens = self.rem_chunk_tokens
        result = original(self, *args, **kwargs)
        # MUTANT: the chunk budget is not charged.
        self.rem_chunk_tokens = rem_chunk_tokens
        return result

    replace_attr(adder_cls, "_update_prefill_budget", _update_prefill_budget, original)


blind6_chunk_budget_not_charged = Patch(
    name="blind6_chunk_budget_not_charged",
    summary="admission never charges the chunked-prefill budget: one pass can start two chunked prompts "
            "(one is cut off mid-prompt) or start one beside a continuing chunk (scheduler assert)",
    install=_install_chunk_budget_not_charged,
    topologies=ALL,
    expected="unknown (written blind): concurrent prompts longer than the chunk size give wrong output "
             "for one of them (decoded from a truncated prompt), or the scheduler dies on an assert",
)


# --- 5. control: a weight-version change skips the waiting queue ----


def _install_weight_version_skips_waiting(scheduler_module: Any) -> None:
    """``Scheduler.record_weight_version_change`` (run by the weight-update
    handlers and update_weight_version when the version changes) appends a
    ``WeightVersionEvent(old_version, len(output_ids))`` to every live request
    that already has output: the in-flight ones, the chunked request, and the
    waiting queue. A finished request reports ``meta_info.weight_versions``
    spans built from those events. The mutant leaves the waiting queue out of
    the live set.

    Plausible: a missed branch; "in-flight" reads as the requests that matter,
    and the waiting queue normally holds requests with no output yet. It does
    not after a retract-mode pause: the retracted requests sit there with their
    outputs. Trigger: pause_generation(mode="retract") with requests mid-decode,
    a weight update (disk/tensor/distributed/ipc, or update_weight_version)
    carrying a new weight_version, continue_generation. Those requests finish
    reporting one span of the new version over all their tokens instead of the
    old version up to the pause and the new one after it. In-place pauses (the
    requests stay in the running batch) and the warm-up (no version change) are
    unchanged."""
    name = "blind6_weight_version_skips_waiting"
    cls = scheduler_class(scheduler_module, name)
    original = find_method(cls, "record_weight_version_change", name, ("new_version",))
    check_copied_body(original, "f5a8b04040994d56", name, "Scheduler.record_weight_version_change")
    get_serving = find_attr(scheduler_module, "get_serving", name, "scheduler.get_serving")
    get_context = find_attr(scheduler_module, "get_context", name, "scheduler.get_context")
    record_weight_version_events = find_attr(scheduler_module, "record_weight_version_events", name,
                                             "scheduler.record_weight_version_events")
    logger = find_attr(scheduler_module, "logger", name, "scheduler.logger")

    def record_weight_version_change(self, new_version):
        if new_version is None or new_version == get_serving().weight_version:
            return

        old_version = get_serving().weight_version
        get_context().override("scheduler.weight_version", weight_version=new_version)

        # MUTANT: the waiting queue (retracted requests keep their output
        # there) is not part of the live set.
        live_reqs = {
            *self.collect_inflight_reqs(),
            *([self.chunked_req] if self.chunked_req is not None else []),
        }
        if self.hisparse_coordinator is not None:
            live_reqs.update(
                act.req for act in self.hisparse_coordinator.ack_staging_queue
            )
        num_recorded = record_weight_version_events(live_reqs, old_version=old_version)
        logger.info(
            f"Weight version changed. {old_version=} {new_version=} {num_recorded=}"
        )

    replace_attr(cls, "record_weight_version_change", record_weight_version_change, original)


blind6_weight_version_skips_waiting = Patch(
    name="blind6_weight_version_skips_waiting",
    summary="a weight-version change records the old version's span only for in-flight requests: "
            "requests parked in the waiting queue by a retract pause report all tokens as the new version",
    install=_install_weight_version_skips_waiting,
    topologies=ALL,
    expected="unknown (written blind): after pause(retract) + weight update with a new weight_version + "
             "continue, a request's meta_info weight_versions lacks the old-version span of its "
             "pre-pause tokens",
)


# --- 5. control: checksum digests cached by tensor storage go stale after an update ----


def _install_weight_checksum_stale(scheduler_module: Any) -> None:
    """``WeightChecker._compute_checksum`` (the ``check_weights`` control
    request, action "checksum") hashes every parameter and buffer with
    ``weight_checker._hash_tensor`` on each query. The mutant memoizes
    ``_hash_tensor`` by the tensor's storage (data pointer, dtype, shape,
    stride, device).

    Plausible: checksum polling hashes every weight every time, a cache keyed by
    storage is the obvious speed-up, and the invalidation on weight updates is
    the part that gets forgotten. Weight loads write parameters in place
    (``param.data.copy_``/weight loaders), so the storage key does not change.
    Trigger: a checksum query, then update_weights_from_tensor /
    update_weights_from_disk with different values, then another checksum
    query: it returns the first query's per-tensor checksums and the same
    overall checksum although the weights changed. A first query, and the
    warm-up, are unchanged."""
    name = "blind6_weight_checksum_stale"
    scheduler_class(scheduler_module, name)
    checker = find_module(WEIGHT_CHECKER, name)
    original = find_attr(checker, "_hash_tensor", name, f"{WEIGHT_CHECKER}._hash_tensor")
    digests: dict = {}

    def _hash_tensor(t):
        # MUTANT: digests cached by storage and never invalidated.
        key = (t.data_ptr(), str(t.dtype), tuple(t.shape), tuple(t.stride()), str(t.device))
        digest = digests.get(key)
        if digest is None:
            digest = original(t)
            digests[key] = digest
        return digest

    replace_attr(checker, "_hash_tensor", _hash_tensor, original)


blind6_weight_checksum_stale = Patch(
    name="blind6_weight_checksum_stale",
    summary="weight checksums are cached by tensor storage: a checksum query after an in-place weight "
            "update returns the pre-update checksums",
    install=_install_weight_checksum_stale,
    topologies=ALL,
    expected="unknown (written blind): the weight checksum does not change across an update that "
             "changed the weights",
)


# --- 6. loop bookkeeping: finished requests leave the running batch only on a merge step ----


def _install_finished_filter_only_on_merge(scheduler_module: Any) -> None:
    """``Scheduler.get_next_batch_to_run`` merges the last prefill batch into
    the running batch and then, on every step, filters finished requests out of
    the running batch ("Every step, not only after a merge: overlap merges a
    prefill's requests before its result finishes them, and
    update_running_batch may never run"). The mutant moves that filter into the
    merge branch, so it runs only on a step that merged a prefill batch.

    Plausible: it reintroduces the shape the upstream comment was written
    against; the filter sits right under the merge and reads as its
    post-processing. Reachable with the overlap loop and with pp (results are
    processed after the next step's merge); in the normal loop a prefill's
    results are processed before the merge and finished requests never enter.
    Trigger: a prefill-only request (max_new_tokens 0) as the last prefill,
    e.g. alone: it is merged before its result finishes it, a running batch of
    prefill-only requests never runs update_running_batch (no decode), and no
    later merge comes. It stays in the running batch: the scheduler never
    becomes idle (flush_cache and release_memory_occupation refused, SGLang's
    idle checks skipped, loads report a running request) until some new
    request's prefill is merged. The warm-up's request decodes and is filtered
    by update_running_batch."""
    name = "blind6_finished_filter_only_on_merge"
    cls = scheduler_class(scheduler_module, name)
    original = find_method(cls, "get_next_batch_to_run", name, ("running_batch", "last_batch"))
    check_copied_body(original, "11f3890cfa8b211f", name, "Scheduler.get_next_batch_to_run")
    next_batch_plan = find_attr(scheduler_module, "NextBatchPlan", name, "scheduler.NextBatchPlan")
    set_schedule_time_batch_ = find_attr(scheduler_module, "set_schedule_time_batch", name,
                                         "scheduler.set_schedule_time_batch")
    sched_envs = find_attr(scheduler_module, "envs", name, "scheduler.envs")

    def get_next_batch_to_run(self, running_batch, last_batch):
        self.process_pending_chunked_abort()
        self._process_hicache_events()

        if self.dllm_config is not None:
            self.dllm_manager.filter_finished_reqs()

        # Merge the prefill batch into the running batch
        reqs_to_exclude = set()

        if self.dllm_config is not None and self.dllm_manager.any_staging_reqs():
            reqs_to_exclude.update(self.dllm_manager.staging_queue)
            for req in self.dllm_manager.staging_queue:
                self.finish_dllm_forward(req)

        if self.chunked_req is not None:
            # Move the chunked request out of the batch so that we can merge
            # only finished requests to running_batch.
            reqs_to_exclude.add(self.chunked_req)

            # A parked chunk (add_chunked_req hybrid-SWA early-return) leaves
            # extend_end at prefix_len: it computed no new KV, so nothing to stash.
            if self.chunked_req.extend_end > self.chunked_req.prefix_len:
                self.stash_chunked_request(self.chunked_req)

        # HiSparse has its own prefill-to-decode transition; skip last_batch merge.
        if self.enable_hisparse:
            ready_reqs = self.hisparse_coordinator.collect_ready_reqs()
            if len(ready_reqs) > 0:
                new_batch = self._build_hisparse_decode_batch(ready_reqs)
                if running_batch.is_empty():
                    running_batch = new_batch
                else:
                    running_batch.merge_batch(new_batch)
                running_batch.hisparse_coordinator = self.hisparse_coordinator
            # Reset batch_is_full so the scheduler can schedule more prefills.
            running_batch.batch_is_full = False

        if (
            not self.enable_hisparse
            and last_batch
            and last_batch.forward_mode.is_extend()
        ):
            if last_batch.chunked_req is not None:
                # In the context pipeline parallelism, after the last chunk, the current microbatch still track outdated chunked_req.
                # We need to discard it.
                reqs_to_exclude.add(last_batch.chunked_req)

            if self.dllm_config is not None and last_batch.reqs:
                reqs_to_exclude.update(last_batch.reqs)

            # Filter batch
            last_bs = last_batch.batch_size()
            last_batch.filter_batch(reqs_to_exclude=list(reqs_to_exclude))
            if last_batch.batch_size() < last_bs:
                running_batch.batch_is_full = False

            # Merge the new batch into the running batch. A running batch that
            # DP attention converted to extend is last_batch itself: filtered
            # in place above, nothing to merge.
            if not last_batch.is_empty() and last_batch is not running_batch:
                if running_batch.is_empty():
                    running_batch = last_batch
                else:
                    # Merge running_batch with prefill batch
                    running_batch.merge_batch(last_batch)

            # MUTANT: the running batch drops its finished requests only on a
            # step that merged a prefill (the filter moved into this branch).
            running_bs = running_batch.batch_size()
            running_batch.filter_batch()
            if running_batch.batch_size() < running_bs:
                running_batch.batch_is_full = False

        if self.dllm_config is not None:
            new_batch = self.get_new_batch_dllm(running_batch)
        elif self._should_defer_prefill(running_batch):
            new_batch = None
        else:
            prefill_plan = self.get_new_batch_prefill(running_batch)
            new_batch = prefill_plan.batch_to_run
            running_batch = prefill_plan.running_batch

        need_mlp_sync = self.require_mlp_sync
        if (
            need_mlp_sync
            and not self.spec_algorithm.is_none()
            and not sched_envs.SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION.get()
        ):
            # NOTE: This branch makes sure prefill and decode batches will not be mixed when spec and dp-attn is enabled.
            # Before merging the new batch into running batch:
            # 1. All new batches are none -> need_mlp_sync remains true (sync is needed for decode batch).
            # 2. All new batches are some (prefill / idle) -> we do not need prepare mlp sync one more time.
            new_batch = self.dp_attn_adapter.maybe_prepare_mlp_sync_batch(new_batch)
            need_mlp_sync = new_batch is None

        if new_batch is not None:
            # Run prefill first if possible
            ret = new_batch
        else:
            # Run decode (skip for prefill-only batches)
            if not running_batch.is_empty() and not running_batch.is_prefill_only:
                decode_batch = self.update_running_batch(running_batch)
                ret = (
                    decode_batch
                    if decode_batch is not None and not decode_batch.is_empty()
                    else None
                )
            else:
                ret = None

        # Handle DP attention and log stats
        ret = self.dp_attn_adapter.maybe_prepare_mlp_sync_batch(
            ret, need_sync=need_mlp_sync
        )
        # Decode->extend conversion keeps a heterogeneous dp step replayable.
        # A converted running batch stays the running batch; next step it comes
        # back as last_batch and is filtered in place, not merged with itself.
        ret = self.dp_attn_adapter.maybe_convert_decode_to_extend(ret)
        self._arm_prefill_decode_interval(ret)

        # Handle ngram embedding
        ret = self.ngram_embedding_manager.prepare_for_forward(
            ret, chunked_req=self.chunked_req
        )

        if ret:
            set_schedule_time_batch_(ret)

        return next_batch_plan(batch_to_run=ret, running_batch=running_batch)


    replace_attr(cls, "get_next_batch_to_run", get_next_batch_to_run, original)


blind6_finished_filter_only_on_merge = Patch(
    name="blind6_finished_filter_only_on_merge",
    summary="finished requests are filtered out of the running batch only on a step that merged a "
            "prefill: a prefill-only request that finishes after its merge stays there, the scheduler "
            "never goes idle",
    install=_install_finished_filter_only_on_merge,
    topologies=OVERLAP_AND_PP,
    expected="unknown (written blind): after a max_new_tokens=0 request completes (overlap/pp), the "
             "server stays busy: flush_cache refused, a finished request still in the running batch",
)


ALL_BLIND6 = (
    "blind6_ignore_eos_keeps_stop_ids",
    "blind6_stop_str_window_short",
    "blind6_prefix_row_not_written",
    "blind6_retract_keep_order_lost",
    "blind6_prefix_hit_not_protected",
    "blind6_admission_pin_leaked",
    "blind6_chunk_budget_not_charged",
    "blind6_weight_version_skips_waiting",
    "blind6_weight_checksum_stale",
    "blind6_finished_filter_only_on_merge",
)
