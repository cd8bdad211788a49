"""Blind mutant set 7: SGLang 0.5.23's scheduler, across six families.

Kept as external patches, like the earlier blind sets; run one with, for
example:

    scripted-runtime mutate --topology pp1-normal --no-corpus \\
        --patch bench/blind_mutants/blind7_mutants.py:blind7_prefill_only_returns_token

Written by a helper author in one sitting; not edited since.

Written from SGLang's own source only (the installed 0.5.23 package), without
reading the harness's checks, contracts, invariants, oracle, explorer, grammar,
strategies, corpus, tests, scenarios or docs, and without looking at the
built-in mutants or at the earlier blind sets beyond their file format and
their docstrings / mutant lists (read to stay off their spots). Each mutant is
a ``Patch`` whose ``install(scheduler_module)`` monkeypatches one spot of
SGLang in the scheduler process, wrapping or replacing the original
(``__wrapped__`` keeps it); where an install copies an SGLang function body to
change a line, or where a wrapper relies on what the wrapped body does, it
pins that body with ``check_copied_body``. The spots avoid the radix tree
core's internals (0.5.23 may run its Rust TreeCore), staying in the Python
cache layer. Ten mutants, at most two per family:

1. request semantics
   * ``blind7_min_tokens_merge_swapped``: ``BatchedMinNewTokensPenalizer._merge``
     concatenates the per-row ``min_new_tokens`` in (theirs, ours) order while
     the stop penalties and output counters stay (ours, theirs): after a
     prefill is merged into a running batch, each row enforces another row's
     min_new_tokens, so a min_new_tokens request can stop early on a stop
     token/EOS.
   * ``blind7_prefill_only_returns_token``: ``Req.update_finish_state`` records
     a length finish as ``finished_len = len(output_ids)`` instead of
     ``max_new_tokens``; identical except for max_new_tokens=0, whose prefill
     token is then returned (one output token instead of none).
2. KV slot mapping / req_to_token rows
   * ``blind7_chunk_takes_fresh_row``: ``ReqToTokenPool.alloc`` hands every
     request of an extend batch a fresh row, also a continuing chunk (or a
     session turn) that already holds one: the prefix is copied over, the old
     row is never freed (one req_to_token row leaked per continuing chunk).
   * ``blind7_session_commit_past_kv``: ``StreamingSession.try_cache_finished_req``
     sets the session record's ``kv_committed_len`` to the finished length
     without clamping it to the allocated KV, so the next turn of a streaming
     session reuses one position (the previous turn's last output token) whose
     KV was never computed and whose row entry is stale.
3. radix / prefix cache (Python cache layer)
   * ``blind7_checkpoint_lock_stale_anchor``: ``UnifiedRadixCache.checkpoint_into_tree``
     moves the request's tree lock onto the stale ``req.last_node`` (the node
     it had before the insert) instead of the insert's new last node, so the
     prompt a running request just published is unlocked (evictable) while it
     decodes on it.
   * ``blind7_prefill_not_published``: ``UnifiedRadixCache.checkpoint`` does
     nothing for an unfinished request, so a prompt (or a prefill chunk) is
     published into the tree only when its request finishes: requests sharing
     it get no prefix hit while it runs.
4. chunked prefill bookkeeping
   * ``blind7_chunk_counted_as_cached``: ``ScheduleBatch.prepare_for_extend``
     no longer advances ``req.already_computed``, so every continuing prefill
     chunk adds the tokens of the earlier chunks to ``cached_tokens``.
5. control operations
   * ``blind7_failed_update_sets_version``:
     ``SchedulerWeightUpdaterManager.update_weights_from_disk`` records the
     requested ``weight_version`` even when the load failed.
6. loop bookkeeping (pipeline parallel) and stream output
   * ``blind7_pp_drained_ignores_inflight`` (pp>1 only):
     ``Scheduler._pp_microbatches_drained`` looks only at the micro-batches'
     running batches, not at the in-flight ``mbs``, so a flush_cache (or a
     weight update's flush) is accepted while a prefill micro-batch is in
     flight.
   * ``blind7_stream_decode_ids_resent``: ``_GenerationStreamAccumulator.accept``
     never advances ``req.send_decode_id_offset``, so every output after a
     request's first one re-sends its whole incremental-detokenization window
     to the detokenizer.

Every install raises ``PatchError`` ("... written against SGLang 0.5.23") when
its target is missing or a pinned body differs. None uses randomness or
timing. None changes what the server's warm-up request does (a single short
non-streaming /generate, temperature 0, max_new_tokens 8, no abort, pause,
flush, session, chunking, prefix hit, stop string, ignore_eos, retraction,
concurrency or memory pressure): each needs a trigger the warm-up does not
have, named in its install function's docstring
(``blind7_checkpoint_lock_stale_anchor`` and ``blind7_prefill_not_published``
do run on the warm-up, but only change which tree node is locked / when the
prompt is published while it decodes; its output, its finish and the tree it
leaves behind are the same). Most are silent (wrong output or metadata, a
state leak, KV or cache state corrupted); ``blind7_chunk_takes_fresh_row`` can
end in SGLang's own idle leak check or a row-exhaustion crash, and
``blind7_session_commit_past_kv`` / ``blind7_checkpoint_lock_stale_anchor`` in
an allocator double free.
"""
from __future__ import annotations

from typing import Any

from scripted_runtime.hooks.mutants.base import (
    check_copied_body,
    find_attr,
    find_method,
    find_module,
    replace_attr,
    scheduler_class,
    weight_updater_manager,
)
from scripted_runtime.hooks.patch_base import Patch

RELEASE = "0.5.23"
ALL = ("pp1-overlap", "pp1-normal", "pp4")
PP_ONLY = ("pp4",)

SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch"
MIN_NEW_TOKENS = "sglang.srt.sampling.penaltylib.min_new_tokens"
MEMORY_POOL = "sglang.srt.mem_cache.memory_pool"
STREAMING_SESSION = "sglang.srt.session.streaming_session"
UNIFIED_RADIX_CACHE = "sglang.srt.mem_cache.unified_radix_cache"
WEIGHT_UPDATER = "sglang.srt.managers.scheduler_components.weight_updater"
OUTPUT_STREAMER = "sglang.srt.managers.scheduler_components.output_streamer"


def _req_class(name: str) -> type:
    batch_module = find_module(SCHEDULE_BATCH, name)
    return find_attr(batch_module, "Req", name, f"{SCHEDULE_BATCH}.Req")


def _radix_cache_class(name: str) -> type:
    cache_module = find_module(UNIFIED_RADIX_CACHE, name)
    return find_attr(cache_module, "UnifiedRadixCache", name, f"{UNIFIED_RADIX_CACHE}.UnifiedRadixCache")


# --- 1. request semantics: min_new_tokens rows misaligned by a merge ----


def _install_min_tokens_merge_swapped(scheduler_module: Any) -> None:
    """``BatchedMinNewTokensPenalizer`` keeps three per-row tensors for a batch:
    ``min_new_tokens``, ``stop_token_penalties`` (-inf on each row's stop ids and
    EOS) and ``len_output_tokens``; ``_apply`` adds a row's penalties while its
    output count is below its min_new_tokens. ``_merge`` (run by
    ``ScheduleBatch.merge_batch`` when a prefill batch joins a running batch)
    concatenates each tensor as (ours, theirs), the order of the merged
    ``reqs``. The mutant concatenates ``min_new_tokens`` as (theirs, ours).

    Plausible: three near-identical ``torch.cat`` calls; one written with its
    operands swapped reads the same at a glance, and with a single request
    (or equal min_new_tokens everywhere) nothing changes. Trigger: a request
    with min_new_tokens > 0 (and a stop token id or EOS the model would emit
    early) merged into a running batch of requests with a different
    min_new_tokens, or the reverse (requests in flight together, the second
    admitted while the first decodes). Rows then enforce another row's
    minimum: the min_new_tokens request may stop on its stop token before
    min_new_tokens tokens (finish_reason matched token, short output), while a
    request without a minimum has its stop tokens suppressed and runs on.
    Works on every loop (the merge is the same). The warm-up has one request
    and no min_new_tokens (no merge, penalizer never prepared)."""
    name = "blind7_min_tokens_merge_swapped"
    scheduler_class(scheduler_module, name)
    penalizer_module = find_module(MIN_NEW_TOKENS, name)
    penalizer_cls = find_attr(penalizer_module, "BatchedMinNewTokensPenalizer", name,
                              f"{MIN_NEW_TOKENS}.BatchedMinNewTokensPenalizer")
    original = find_method(penalizer_cls, "_merge", name, ("their",))
    check_copied_body(original, "2d8a38c0dc14bf81", name, "BatchedMinNewTokensPenalizer._merge")
    torch = find_attr(penalizer_module, "torch", name, f"{MIN_NEW_TOKENS}.torch")

    def _merge(self, their):
        # MUTANT: (theirs, ours) here, (ours, theirs) for the other two tensors.
        self.min_new_tokens = torch.cat(
            [their.min_new_tokens, self.min_new_tokens], dim=0
        )
        self.stop_token_penalties = torch.cat(
            [self.stop_token_penalties, their.stop_token_penalties], dim=0
        )
        self.len_output_tokens = torch.cat(
            [self.len_output_tokens, their.len_output_tokens], dim=0
        )

    replace_attr(penalizer_cls, "_merge", _merge, original)


blind7_min_tokens_merge_swapped = Patch(
    name="blind7_min_tokens_merge_swapped",
    summary="merging a prefill into a running batch misaligns the min_new_tokens penalizer rows: each "
            "request enforces another request's min_new_tokens",
    install=_install_min_tokens_merge_swapped,
    topologies=ALL,
    expected="unknown (written blind): with concurrent requests of different min_new_tokens, a request "
             "finishes on a stop token/EOS with fewer than its min_new_tokens output tokens (or one "
             "without a minimum cannot stop)",
)


# --- 1. request semantics: a max_new_tokens=0 request returns its prefill token ----


def _install_prefill_only_returns_token(scheduler_module: Any) -> None:
    """``Req.update_finish_state`` finishes a request by length once
    ``len(output_ids) >= max_new_tokens`` and records ``finished_len =
    max_new_tokens``; the streamer sends ``output_ids[:finished_len]``. The
    mutant records ``finished_len = len(output_ids)``.

    Plausible: the two are equal for every request that decodes (the check
    runs after each appended token), so the "simpler" form passes ordinary
    tests. Not for a prefill-only request: with max_new_tokens=0 the prefill
    still samples and appends one token, and only ``finished_len = 0`` keeps
    it out of the output. Trigger: a /generate with max_new_tokens=0 (also the
    prefix-caching request that parallel sampling, n>1, sends first; the
    tokenizer discards that one's output). The user sees one output token
    (completion_tokens 1, non-empty text/output_ids) with finish_reason length
    0 instead of an empty output. Other requests are unchanged (the warm-up's
    8 tokens finish with finished_len 8 either way)."""
    name = "blind7_prefill_only_returns_token"
    batch_module = find_module(SCHEDULE_BATCH, name)
    req_cls = _req_class(name)
    original = find_method(req_cls, "update_finish_state", name, ("new_accepted_len",))
    check_copied_body(original, "ac20519c269e99ac", name, "Req.update_finish_state")
    finish_length = find_attr(batch_module, "FINISH_LENGTH", name, f"{SCHEDULE_BATCH}.FINISH_LENGTH")
    finish_matched_token = find_attr(batch_module, "FINISH_MATCHED_TOKEN", name,
                                     f"{SCHEDULE_BATCH}.FINISH_MATCHED_TOKEN")

    def update_finish_state(self, new_accepted_len=1):
        if self.finished():
            return

        if self.to_finish:
            self.finished_reason = self.to_finish
            self.to_finish = None
            return

        new_accepted_tokens = self.output_ids[-new_accepted_len:]

        # Sanitize out-of-range / NaN token ids before any decode.
        if self._check_vocab_boundary_finish(new_accepted_tokens):
            self._cap_finished_len_at_max_new_tokens()
            return

        # Stop string beats EOS/stop-token matched in the same step (speculative
        # decoding can accept >1 token): token-based would trim only the last
        # token and leak the stop string.
        if self._check_str_based_finish(new_accepted_len):
            self._cap_finished_len_at_max_new_tokens()
            return

        # Stop token/EOS beats the length cap for the same reason: a spec accept
        # run can cross max_new_tokens in the very step the EOS lands, and a
        # length-first finish would keep the over-accepted tokens after the EOS
        # (up to the cap) in the emitted output.
        if self._check_token_based_finish(new_accepted_tokens):
            self._cap_finished_len_at_max_new_tokens()
            return

        if len(self.output_ids) >= self.sampling_params.max_new_tokens:
            self.finished_reason = finish_length(
                length=self.sampling_params.max_new_tokens
            )
            # MUTANT: the output length, not max_new_tokens.
            self.finished_len = len(self.output_ids)
            return

        if self.grammar is not None and self.grammar.is_terminated():
            self.finished_reason = finish_matched_token(matched=self.output_ids[-1])
            return

    replace_attr(req_cls, "update_finish_state", update_finish_state, original)


blind7_prefill_only_returns_token = Patch(
    name="blind7_prefill_only_returns_token",
    summary="a length finish records finished_len = len(output_ids): a max_new_tokens=0 request returns "
            "its prefill token instead of an empty output",
    install=_install_prefill_only_returns_token,
    topologies=ALL,
    expected="unknown (written blind): a max_new_tokens=0 /generate returns one output token "
             "(completion_tokens 1) instead of none",
)


# --- 2. KV slot mapping: a continuing chunk is moved to a fresh row, the old one leaks ----


def _install_chunk_takes_fresh_row(scheduler_module: Any) -> None:
    """``ReqToTokenPool.alloc(reqs)`` (via ``alloc_req_slots`` in
    ``alloc_for_extend``) takes free rows only for the requests that hold none;
    a request that already holds its req_to_token row (a continuing prefill
    chunk, a streaming-session turn running on the session's record) keeps it.
    The mutant takes ``len(reqs)`` rows and binds a fresh one to every request.

    Plausible: it is the allocator's shape before row reuse existed ("one row
    per request of the batch"); the content stays right because
    ``alloc_for_extend`` read the prefix slots off the old row before the
    allocation and writes them into the new one, so outputs do not change.
    Trigger: chunked prefill (a prompt longer than the chunk size, 64 here) or
    a second turn of a streaming session. Each such extend leaks the row the
    request held: it is neither free nor owned by anyone, so at idle the
    request pool is short by one row per continuing chunk (SGLang's own idle
    check reports a req_to_token_pool leak), and once rows run out admission
    stalls or ``alloc_req_slots`` raises (the admission budget counted the held
    row as reusable). The warm-up holds no row when it is admitted (same
    allocation)."""
    name = "blind7_chunk_takes_fresh_row"
    scheduler_class(scheduler_module, name)
    pool_module = find_module(MEMORY_POOL, name)
    pool_cls = find_attr(pool_module, "ReqToTokenPool", name, f"{MEMORY_POOL}.ReqToTokenPool")
    original = find_method(pool_cls, "alloc", name, ("reqs",))
    check_copied_body(original, "aef650224ed4593e", name, "ReqToTokenPool.alloc")

    def alloc(self, reqs):
        reusing = [i for i, r in enumerate(reqs) if r.kv.holds_kv]
        assert all(reqs[i].kv.kv_allocated_len > 0 for i in reusing), (
            "a reused row must carry allocated KV"
        )

        # MUTANT: a fresh row for every request, also those that hold one.
        select_index = self.alloc_rows(len(reqs))
        if select_index is None:
            return None
        for r, row in zip(reqs, select_index):
            r.kv.req_pool_idx = row
        return [r.kv.req_pool_idx for r in reqs]

    replace_attr(pool_cls, "alloc", alloc, original)


blind7_chunk_takes_fresh_row = Patch(
    name="blind7_chunk_takes_fresh_row",
    summary="a continuing prefill chunk (or session turn) gets a fresh req_to_token row; the row it "
            "held is never freed",
    install=_install_chunk_takes_fresh_row,
    topologies=ALL,
    expected="unknown (written blind): after chunked prompts, req_to_token rows leaked at idle (free "
             "rows + held rows < pool size); later admission stalls or the scheduler dies on a row "
             "allocation",
)


# --- 2. KV slot mapping: a streaming session commits a position it never computed ----


def _install_session_commit_past_kv(scheduler_module: Any) -> None:
    """When a streaming-session turn finishes, ``StreamingSession.try_cache_finished_req``
    keeps its KV record in the session slot for the next turn and sets
    ``slot.kv.kv_committed_len = min(origin + finished_len, kv_allocated_len)``:
    the last output token is sampled but never fed back, so its KV (and its
    req_to_token entry) does not exist, and the clamp keeps the record at what
    was computed. The next turn's match (``try_match_prefix``) reuses
    ``min(kv_committed_len, len(key))`` positions. The mutant drops the clamp.

    Plausible: the comment beside it says to use the finished length, and on
    the overlap path (where an extra decode step usually ran) the two agree.
    Trigger: a streaming session (open_session streaming=True) with a turn that
    finished without an overshoot decode step (a length finish, or any finish
    on the normal loop) followed by another turn. That turn reuses one
    position too many: the previous turn's last output token is treated as
    cached although its row entry is stale (slot 0 or a previous occupant's
    slot), so the turn attends to garbage KV there (its output differs from a
    fresh request with the same full prompt), and when the session is released
    that stale slot is freed as its own (a double free / a slot freed under
    another owner: free counts past the pool size). Non-session requests and
    the warm-up never reach this."""
    name = "blind7_session_commit_past_kv"
    scheduler_class(scheduler_module, name)
    batch_module = find_module(SCHEDULE_BATCH, name)
    session_module = find_module(STREAMING_SESSION, name)
    session_cls = find_attr(session_module, "StreamingSession", name, f"{STREAMING_SESSION}.StreamingSession")
    original = find_method(session_cls, "try_cache_finished_req", name, ("req",))
    check_copied_body(original, "affeef40c2104d20", name, "StreamingSession.try_cache_finished_req")
    is_streaming = find_attr(session_module, "_is_streaming", name, f"{STREAMING_SESSION}._is_streaming")
    finish_abort = find_attr(batch_module, "FINISH_ABORT", name, f"{SCHEDULE_BATCH}.FINISH_ABORT")

    def try_cache_finished_req(self, req):
        if not is_streaming(req):
            return False

        slot = self.borrowed_slot(req)
        assert slot is not None, f"streaming {req.rid=} does not run on its slot"
        if isinstance(req.finished_reason, finish_abort):
            # Hand the record and the tree lock back; the caller releases them.
            del self.slots[req.session.session_id]
            req.lock, slot.lock = slot.lock, None
            req.release_mm_inputs_on_abort()
            req.session.abort_req()
            return False

        finished_len = (
            req.finished_len if req.finished_len is not None else len(req.output_ids)
        )
        target = len(req.origin_input_ids) + finished_len
        self._trim_overshoot(req, finished_len)

        req.detach_kv()
        req.swa_branching_seqlen = None
        slot.publishes_prompt = False
        # MUTANT: the finished length, not clamped to the KV actually allocated.
        slot.kv.kv_committed_len = target

        # Update req_nodes to this successfully finished request.
        req.session.finish_req(req)

        return True

    replace_attr(session_cls, "try_cache_finished_req", try_cache_finished_req, original)


blind7_session_commit_past_kv = Patch(
    name="blind7_session_commit_past_kv",
    summary="a finished streaming-session turn commits its last output token's position although its KV "
            "was never computed: the next turn reuses a stale req_to_token entry",
    install=_install_session_commit_past_kv,
    topologies=ALL,
    expected="unknown (written blind): the second turn of a streaming session gives different output "
             "than the same prompt sent fresh, and its row holds a slot it does not own (double free / "
             "free count past the pool size after the session closes)",
)


# --- 3. radix cache: the checkpoint's lock stays on the stale anchor ----


def _install_checkpoint_lock_stale_anchor(scheduler_module: Any) -> None:
    """``UnifiedRadixCache.checkpoint_into_tree`` inserts the request's computed
    tokens (after its prefill, after each prefill chunk, at finish), repoints
    its row at the tree's slots, marks them tree-owned
    (``cache_protected_len``) and moves the request's tree lock:
    ``unlock(req.lock)`` then ``req.lock = lock(new_last_node)``, and only then
    ``req.last_node = new_last_node``. The mutant locks ``req.last_node``, the
    node the request had before this insert (its matched prefix, root
    without a hit, or the previous checkpoint's node).

    Plausible: the lock move and the ``last_node`` update sit a few lines apart;
    locking ``req.last_node`` before it is updated is an ordering slip, and lock
    counts stay balanced (the same node is unlocked at release), so no
    leak check fires. Trigger: any request that is checkpointed while it still
    runs (every request that decodes: its prompt is published after the
    prefill; chunked prompts after each chunk), then KV pressure that makes the
    allocator evict. The tokens the request just published are unlocked while
    it decodes on them: eviction can free them (the request's row still points
    at them, it does not free them itself), new allocations reuse the slots,
    and the running request attends to overwritten KV (wrong output); its
    finish insert then re-publishes slots another request owns (double free or
    leak). Without eviction nothing differs; the warm-up runs without memory
    pressure and ends with the same tree and no locks."""
    name = "blind7_checkpoint_lock_stale_anchor"
    scheduler_class(scheduler_module, name)
    cache_cls = _radix_cache_class(name)
    original = find_method(cache_cls, "checkpoint_into_tree", name, ("req", "up_to"))
    # The wrapper relies on this body moving req.lock to a new TreeLock and
    # updating req.last_node afterwards.
    check_copied_body(original, "b405351976acd1ff", name, "UnifiedRadixCache.checkpoint_into_tree")

    def checkpoint_into_tree(self, req, *, up_to, **kwargs):
        stale_anchor = req.last_node
        old_lock = req.lock
        original(self, req, up_to=up_to, **kwargs)
        if req.lock is not None and req.lock is not old_lock and stale_anchor is not None:
            # MUTANT: the lock goes to the node the request had before the insert.
            self.unlock(req.lock)
            req.lock = self.lock(stale_anchor)

    replace_attr(cache_cls, "checkpoint_into_tree", checkpoint_into_tree, original)


blind7_checkpoint_lock_stale_anchor = Patch(
    name="blind7_checkpoint_lock_stale_anchor",
    summary="a checkpoint moves the request's tree lock onto its pre-insert node: the prompt a running "
            "request just published is evictable while it decodes on it",
    install=_install_checkpoint_lock_stale_anchor,
    topologies=ALL,
    expected="unknown (written blind): a running request's published prefix is not locked (protected); "
             "under KV pressure it is evicted under the request: wrong output for that request, KV "
             "slots owned twice / freed twice afterwards",
)


# --- 3. radix cache: an unfinished request publishes nothing ----


def _install_prefill_not_published(scheduler_module: Any) -> None:
    """``UnifiedRadixCache.checkpoint(req, up_to=...)`` is the tree entry for
    both a running request (``checkpoint_kv_cache`` after its prefill, after
    each prefill chunk) and a finishing one (``release_kv_cache``). For a
    running request it publishes what is computed so far, so that requests
    admitted meanwhile with the same prefix get a hit. The mutant returns at
    once for an unfinished request.

    Plausible: "publish only finished requests" looks like the safe choice
    (nothing half-done in the tree), and everything stays consistent: the
    request keeps its own slots (``cache_protected_len`` unchanged) and inserts
    them at finish, so outputs and leak checks are unaffected. Trigger: a
    request sharing a prefix with one that is still running (admitted after
    the first one's prefill, e.g. the same prompt sent again while the first
    still decodes), or a request sharing the prefix of a long prompt that is
    still being prefilled chunk by chunk. That request gets no prefix hit
    (cached_tokens 0, its prefix recomputed) until the first one finishes; a
    streaming session's first prompt is not shared with other requests while
    its turn runs. (n>1 is unaffected: its prefix request has
    max_new_tokens=0 and finishes at once.) The warm-up's prompt is published
    at its finish instead of after its prefill; the tree it leaves is the
    same."""
    name = "blind7_prefill_not_published"
    scheduler_class(scheduler_module, name)
    cache_cls = _radix_cache_class(name)
    original = find_method(cache_cls, "checkpoint", name, ("req", "up_to"))

    def checkpoint(self, req, *, up_to, **kwargs):
        # MUTANT: a running request is never published.
        if not req.finished():
            return None
        return original(self, req, up_to=up_to, **kwargs)

    replace_attr(cache_cls, "checkpoint", checkpoint, original)


blind7_prefill_not_published = Patch(
    name="blind7_prefill_not_published",
    summary="an unfinished request's checkpoint publishes nothing: a prompt enters the radix tree only "
            "when its request finishes",
    install=_install_prefill_not_published,
    topologies=ALL,
    expected="unknown (written blind): a request sharing a prefix with a still-running request gets no "
             "prefix hit (cached_tokens 0); the tree holds no node for a running request's prompt",
)


# --- 4. chunked prefill: earlier chunks are counted as cache hits ----


def _install_chunk_counted_as_cached(scheduler_module: Any) -> None:
    """``ScheduleBatch.prepare_for_extend`` counts a request's cache hit as
    ``cached_tokens += prefix_len - already_computed`` and then sets
    ``already_computed = seq_len``, so a continuing chunk (whose prefix is the
    request's own earlier chunks) adds nothing. The mutant leaves
    ``already_computed`` where it was.

    Plausible: a one-line omission in a block that "only counts once" anyway
    (``retracted_stain``); a request that is not chunked is counted once
    whatever ``already_computed`` ends as. Trigger: a prompt longer than the
    chunk size (64 here), with or without a prefix hit. Each continuing chunk
    adds all tokens computed by the earlier chunks (plus the hit again):
    meta_info ``cached_tokens`` of a fresh 150-token prompt reads 64 + 128 =
    192 instead of 0, more than the prompt itself. The prefill work, outputs
    and KV are unchanged. The warm-up is one short prompt."""
    name = "blind7_chunk_counted_as_cached"
    scheduler_class(scheduler_module, name)
    batch_module = find_module(SCHEDULE_BATCH, name)
    batch_cls = find_attr(batch_module, "ScheduleBatch", name, f"{SCHEDULE_BATCH}.ScheduleBatch")
    original = find_method(batch_cls, "prepare_for_extend", name)
    # The wrapper relies on this body counting cached_tokens from already_computed.
    check_copied_body(original, "3fe1657467713439", name, "ScheduleBatch.prepare_for_extend")

    def prepare_for_extend(self):
        before = [(req, req.already_computed) for req in self.reqs]
        original(self)
        # MUTANT: req.already_computed = seq_len is gone.
        for req, already_computed in before:
            req.already_computed = already_computed

    replace_attr(batch_cls, "prepare_for_extend", prepare_for_extend, original)


blind7_chunk_counted_as_cached = Patch(
    name="blind7_chunk_counted_as_cached",
    summary="each continuing prefill chunk counts the request's earlier chunks as cache hits: "
            "cached_tokens of a chunked prompt is inflated (can exceed the prompt length)",
    install=_install_chunk_counted_as_cached,
    topologies=ALL,
    expected="unknown (written blind): meta_info cached_tokens > 0 for a fresh prompt longer than the "
             "chunk size (larger than the prompt for 3+ chunks)",
)


# --- 5. control: a failed disk update still records the new weight version ----


def _install_failed_update_sets_version(scheduler_module: Any) -> None:
    """``SchedulerWeightUpdaterManager.update_weights_from_disk`` loads the
    checkpoint into each runner and, only if that succeeded, records the
    request's ``weight_version`` (``record_weight_version_change``: the
    version the scheduler stamps on outputs, and the old-version span of every
    live request); a failed load rolls the weights back and leaves the version.
    The mutant records the version whatever the outcome.

    Plausible: the version bump moved out of the ``if success`` (e.g. so that it
    is recorded before the flush, "the version the caller asked for"), and
    successful updates behave the same. Trigger: update_weights_from_disk with
    a weight_version and a path that fails to load (missing or incompatible
    checkpoint). The call still answers success=False and the weights are the
    old ones, but the scheduler now reports the new version: requests finished
    afterwards carry it in meta_info (weight_version / weight_versions spans),
    disagreeing with the tokenizer's version, and requests live across the call
    get a version boundary. The warm-up makes no update."""
    name = "blind7_failed_update_sets_version"
    cls = weight_updater_manager(scheduler_module, name)
    updater_module = find_module(WEIGHT_UPDATER, name)
    original = find_method(cls, "update_weights_from_disk", name, ("recv_req",))
    check_copied_body(original, "4472b641e423dd9e", name,
                      "SchedulerWeightUpdaterManager.update_weights_from_disk")
    output_cls = find_attr(updater_module, "UpdateWeightFromDiskReqOutput", name,
                           f"{WEIGHT_UPDATER}.UpdateWeightFromDiskReqOutput")
    logger = find_attr(updater_module, "logger", name, f"{WEIGHT_UPDATER}.logger")

    def update_weights_from_disk(self, recv_req):
        """In-place update of the weights from disk."""
        with self._observe_weight_load("disk"):
            success, message = True, "Succeeded to update model weights."
            target_updated = False
            for role, runner in self._select_runners():
                success, message = runner.weight_updater.update_weights_from_disk(
                    recv_req.model_path,
                    recv_req.load_format,
                    recapture_cuda_graph=recv_req.recapture_cuda_graph,
                )
                if not success:
                    break
                target_updated |= role == "target"
            # MUTANT: recorded whether or not the load succeeded.
            self.record_weight_version_after_update(recv_req.weight_version)
            # the served weights changed even if a draft runner failed afterwards
            if target_updated:
                success, message = self.flush_cache_after_weight_update(
                    recv_req, success, message
                )
            if not success:
                logger.error(message)
            return output_cls(
                success=success, message=message, num_paused_requests=0
            )

    replace_attr(cls, "update_weights_from_disk", update_weights_from_disk, original)


blind7_failed_update_sets_version = Patch(
    name="blind7_failed_update_sets_version",
    summary="update_weights_from_disk records the requested weight_version even when loading failed "
            "(weights unchanged, version changed)",
    install=_install_failed_update_sets_version,
    topologies=ALL,
    expected="unknown (written blind): after a failed update_weights_from_disk carrying a weight_version, "
             "later outputs report that version (meta_info weight_version(s)) though the weights are old",
)


# --- 6. pipeline parallel: in-flight micro-batches do not count as busy ----


def _install_pp_drained_ignores_inflight(scheduler_module: Any) -> None:
    """``Scheduler.is_fully_idle`` (the gate of flush_cache, of the flushes that
    weight updates and release_memory_occupation run, of deferred flushes and of
    health checks) asks ``_pp_microbatches_drained``: with pp > 1 every
    micro-batch's running batch is empty and no micro-batch (``mbs``) is in
    flight. The mutant checks only the running batches.

    Plausible: "the running batches hold every request" is true at pp = 1 and
    after a merge; a freshly launched prefill micro-batch sits in ``mbs`` only,
    until its result is processed and it is merged a loop later. Trigger (pp4):
    flush_cache (or a weight update with flush, or release_memory_occupation)
    arriving while a prefill micro-batch is in flight and nothing else runs or
    waits, e.g. right after sending a request. The flush is accepted: tree,
    req_to_token pool and KV allocator are reset under the in-flight request,
    which then decodes on slots and a row the allocator hands out again (wrong
    output for it or a later request, free counts off, double frees when it
    finishes). pp = 1 returns True before the changed line; the warm-up sends
    no flush (on_idle runs only with every micro-batch empty)."""
    name = "blind7_pp_drained_ignores_inflight"
    cls = scheduler_class(scheduler_module, name)
    original = find_method(cls, "_pp_microbatches_drained", name)
    check_copied_body(original, "2ec496a7dea0df21", name, "Scheduler._pp_microbatches_drained")
    get_parallel = find_attr(scheduler_module, "get_parallel", name, "scheduler.get_parallel")

    def _pp_microbatches_drained(self):
        if get_parallel().pp_size == 1:
            return True
        # MUTANT: the in-flight micro-batches (self.mbs) are not checked.
        return all(x.is_empty() for x in self.running_mbs)

    replace_attr(cls, "_pp_microbatches_drained", _pp_microbatches_drained, original)


blind7_pp_drained_ignores_inflight = Patch(
    name="blind7_pp_drained_ignores_inflight",
    summary="PP: is_fully_idle ignores in-flight micro-batches, so flush_cache is accepted while a "
            "prefill micro-batch is running",
    install=_install_pp_drained_ignores_inflight,
    topologies=PP_ONLY,
    expected="unknown (written blind): pp4 flush_cache right after a request reports success while the "
             "request is in flight; afterwards KV/row accounting is off (double frees / leaks) and "
             "outputs may be wrong",
)


# --- 6. stream output: the incremental-detokenization window is re-sent ----


def _install_stream_decode_ids_resent(scheduler_module: Any) -> None:
    """For each request it emits, ``_GenerationStreamAccumulator.accept``
    appends ``decode_ids[req.send_decode_id_offset:]`` (the incremental
    detokenization window: a few prompt tokens of context plus the output so
    far) and advances ``send_decode_id_offset``; the detokenizer extends its
    per-request id list with what it receives. The mutant never advances the
    offset.

    Plausible: the offset is advanced in one line next to three sibling
    offsets, and a request emitted once (non-streaming, under the forced
    interval of 50 tokens) is unaffected. Trigger: a streaming request that
    emits at least two chunks (or a non-streaming one longer than 50 tokens).
    From the second emission on, the whole window is re-sent and appended
    again by the detokenizer: the streamed text (and the final text) repeats
    earlier output and prompt text, while output_ids / token counts stay right.
    The warm-up is one non-streaming 8-token request, emitted once."""
    name = "blind7_stream_decode_ids_resent"
    scheduler_class(scheduler_module, name)
    streamer_module = find_module(OUTPUT_STREAMER, name)
    acc_cls = find_attr(streamer_module, "_GenerationStreamAccumulator", name,
                        f"{OUTPUT_STREAMER}._GenerationStreamAccumulator")
    original = find_method(acc_cls, "accept", name, ("req",))
    # The wrapper relies on this body advancing send_decode_id_offset itself.
    check_copied_body(original, "cdc71fa36934c85c", name, "_GenerationStreamAccumulator.accept")

    def accept(self, *, req):
        send_decode_id_offset = req.send_decode_id_offset
        original(self, req=req)
        # MUTANT: the decode-id offset is not advanced.
        req.send_decode_id_offset = send_decode_id_offset

    replace_attr(acc_cls, "accept", accept, original)


blind7_stream_decode_ids_resent = Patch(
    name="blind7_stream_decode_ids_resent",
    summary="the output streamer never advances send_decode_id_offset: every emission after the first "
            "re-sends the whole detokenization window, so streamed text repeats",
    install=_install_stream_decode_ids_resent,
    topologies=ALL,
    expected="unknown (written blind): a multi-chunk streaming request's text contains repeated "
             "segments (text disagrees with output_ids); single-emission requests unaffected",
)


ALL_BLIND7 = (
    "blind7_min_tokens_merge_swapped",
    "blind7_prefill_only_returns_token",
    "blind7_chunk_takes_fresh_row",
    "blind7_session_commit_past_kv",
    "blind7_checkpoint_lock_stale_anchor",
    "blind7_prefill_not_published",
    "blind7_chunk_counted_as_cached",
    "blind7_failed_update_sets_version",
    "blind7_pp_drained_ignores_inflight",
    "blind7_stream_decode_ids_resent",
)
