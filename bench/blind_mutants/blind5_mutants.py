"""Blind mutant set 5: SGLang 0.5.23's scheduler, across six families.

Kept as external patches, like the third and fourth blind sets; run one with,
for example:

    scripted-runtime mutate --topology pp1-overlap --no-corpus \
        --patch bench/blind_mutants/blind5_mutants.py:blind5_abort_misses_unmerged_prefill

Written by a helper author in one sitting on 2026-11-27; not edited since.

Written from SGLang's own source only (the installed 0.5.23 package), without
reading the harness's checks, explorer, corpus, tests or check docs, and
without looking at the built-in mutants or at the earlier blind sets beyond
their file format. Each mutant is a ``Patch`` whose
``install(scheduler_module)`` monkeypatches one spot of SGLang by wrapping the
original (``__wrapped__`` keeps it). Ten mutants, at most two per family:

1. request lifecycle / semantics
   * ``blind5_abort_misses_unmerged_prefill``: ``Scheduler.abort_request`` looks
     for running requests only in the running batch(es), not in the prefill
     batch that ran last (``last_batch`` / the PP micro-batches ``mbs``) and is
     not merged yet, so an abort landing right after a request's prefill is
     dropped and the request finishes normally.
   * ``blind5_stop_token_trimmed``: ``Req._check_token_based_finish`` records
     ``finished_len`` as the stop token's position instead of a length, so a
     request stopped by a stop token / EOS loses that token from its output.
2. KV slot mapping / req_to_token content
   * ``blind5_dedup_row_not_repointed``: ``UnifiedRadixCache.checkpoint_into_tree``
     frees the request's slots that duplicate what the tree already holds but
     leaves the request's req_to_token row pointing at them.
   * ``blind5_chunk_resume_slot_shift``: ``ScheduleBatch.prepare_for_extend``
     writes a continuing chunk's new KV slots one position early in its row.
3. prefix (radix) cache
   * ``blind5_evict_ignores_free_space``: ``BaseTokenToKVPoolAllocator.evict_to_free_tokens``
     evicts the whole allocation size from the radix tree on every
     allocation, whatever is already free.
4. admission / prefill budget
   * ``blind5_admit_one_past_row_budget``: the admission loop of
     ``Scheduler._get_new_batch_prefill_raw`` admits one request more than
     ``Scheduler.get_num_allocatable_reqs`` allows.
5. control operations
   * ``blind5_session_history_drops_last_token``: ``Session._concat_token_arrays``
     trims the previous turn's output one token short when building a session
     continuation.
   * ``blind5_paused_flush_refused``: ``Scheduler.flush_cache`` no longer
     ignores the waiting queue while the engine is paused, so a flush (or a
     weight update) after a retract-mode pause is refused.
6. overlap / pipeline-parallel bookkeeping of in-flight batches
   * ``blind5_finishing_skip_not_inflight`` (overlap loop only):
     ``Scheduler._reqs_finishing_inflight`` also skips requests whose last
     token is not in the queued result, so they leave the running batch
     unfinished.
   * ``blind5_pp_stale_chunk_merged`` (pp>1 only): ``Scheduler.get_next_batch_to_run``
     no longer drops a micro-batch's outdated ``chunked_req`` when it merges
     that micro-batch's last prefill, so a chunked prompt is merged into two
     micro-batches' running batches.

Every install raises ``PatchError`` ("... written against SGLang 0.5.23") when
its target is missing. None uses randomness or timing. None changes what the
server's warm-up request does (a single short /generate, temperature 0,
max_new_tokens 8, no abort, pause, flush, session, chunking, prefix hit,
concurrency or memory pressure), except that ``blind5_stop_token_trimmed``
would drop a stop token from its output if the model emits EOS within those 8
tokens (it still completes normally). Most are silent (wrong output, wrong
answer to a control request, cache or KV state corrupted without SGLang's own
idle check noticing); ``blind5_admit_one_past_row_budget`` is a scheduler crash
under a burst, ``blind5_finishing_skip_not_inflight`` a hang (then SGLang's
strict idle leak check raises), ``blind5_pp_stale_chunk_merged`` wrong output
that may end in a crash.
"""
from __future__ import annotations

from typing import Any

from scripted_runtime.hooks.mutants.base import (
    find_attr,
    find_method,
    find_module,
    missing_target,
    replace_attr,
    scheduler_class,
)
from scripted_runtime.hooks.patch_base import Patch

RELEASE = "0.5.23"
ALL = ("pp1-overlap", "pp1-normal", "pp4")
OVERLAP = ("pp1-overlap",)
PP4 = ("pp4",)

SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch"
UNIFIED_RADIX_CACHE = "sglang.srt.mem_cache.unified_radix_cache"
ALLOCATOR_BASE = "sglang.srt.mem_cache.allocator.base"
BASE_PREFIX_CACHE = "sglang.srt.mem_cache.base_prefix_cache"
SESSION_CONTROLLER = "sglang.srt.session.session_controller"


# --- 1. lifecycle: an abort right after prefill misses the unmerged prefill batch ----


def _install_abort_misses_unmerged_prefill(scheduler_module: Any) -> None:
    """An abort of a running request looks only in the running batch, not in the prefill batch not yet merged.

    The bug: 0.5.23's ``Scheduler.abort_request`` ends with "Abort method 3":
    for every request of ``self.collect_inflight_reqs()`` whose rid matches it
    sets ``req.to_finish = FINISH_ABORT()``. ``collect_inflight_reqs`` walks
    ``_collect_inflight_batches()``: ``[self.running_batch, self.last_batch]``
    at pp=1 and ``[*self.running_mbs, *self.mbs]`` under PP. The mutant
    behaves as if that sweep walked only the running batch(es)
    (``self.running_batch``, or ``self.running_mbs`` under PP): the batch that
    just ran a prefill, whose requests are merged into the running batch only
    by the next ``get_next_batch_to_run``, is not searched. Implemented by
    shadowing ``collect_inflight_reqs`` on the scheduler for the duration of
    the handler.

    Why plausible: "a started request lives in the running batch" is the
    common mental model; ``last_batch`` reads like a history pointer, and for
    decode batches it *is* the running batch, so dropping it looks redundant.

    Trigger: an abort (POST /abort_request with a rid, or abort_all) that the
    scheduler receives after a request's prefill ran and before that prefill
    batch was merged: at pp=1 the very next loop iteration after the prefill
    (the abort is ingested before the merge); under PP, any time before the
    micro-batch's next turn (a window of pp_size iterations). Queued and
    chunked requests and decoding requests are aborted as before.

    Seen by (written blind): the aborted request is not aborted: it runs to
    its normal finish (length/stop), returns its full output with a non-abort
    finish_reason, and the tokenizer, having marked the abort sent, does not
    retry it. Nothing leaks.
    """
    name = "blind5_abort_misses_unmerged_prefill"
    cls = scheduler_class(scheduler_module, name)
    original = find_method(cls, "abort_request", name, ("recv_req",))
    find_method(cls, "collect_inflight_reqs", name)
    find_method(cls, "_collect_inflight_batches", name)

    def abort_request(self, recv_req):
        def running_batches_only():
            # MUTANT: last_batch (pp=1) / self.mbs (PP) are not searched
            mbs = getattr(self, "running_mbs", None)
            batches = list(mbs) if mbs else [self.running_batch]
            return {req for batch in batches if batch is not None for req in batch.reqs}

        own = vars(self)
        shadowed = "collect_inflight_reqs" in own
        saved = own.get("collect_inflight_reqs")
        self.collect_inflight_reqs = running_batches_only
        try:
            return original(self, recv_req)
        finally:
            if shadowed:
                self.collect_inflight_reqs = saved
            else:
                del self.collect_inflight_reqs

    abort_request.__name__ = abort_request.__qualname__ = "abort_request"
    replace_attr(cls, "abort_request", abort_request, original)


blind5_abort_misses_unmerged_prefill = Patch(
    name="blind5_abort_misses_unmerged_prefill",
    summary="an abort that arrives after a request's prefill but before that prefill batch is merged into "
            "the running batch is dropped: the request runs to its normal finish",
    install=_install_abort_misses_unmerged_prefill,
    topologies=ALL,
    expected="unknown (written blind): an aborted request that completes with its full output and a "
             "length/stop finish_reason instead of an abort",
)


# --- 2. lifecycle: finished_len of a stop-token match is a position, not a length ----


def _install_stop_token_trimmed(scheduler_module: Any) -> None:
    """A request stopped by a stop token / EOS loses that token from its output.

    The bug: ``Req._check_token_based_finish`` scans the newly accepted
    tokens for a stop token id (``sampling_params.stop_token_ids``), the
    model's EOS ids or the tokenizer's EOS, and on a match sets::

        matched_pos = len(self.output_ids) - len(new_accepted_tokens) + i
        self.finished_len = matched_pos + 1

    so that ``output_ids_through_stop`` (``output_ids[:finished_len]``), what
    the output streamer sends and counts as completion_tokens, includes the
    stop token. The mutant behaves as if it read ``self.finished_len =
    matched_pos``. Implemented by wrapping the method and lowering
    ``finished_len`` by one after a match.

    Why plausible: a position/length off-by-one; "finished_len" reads like an
    index, and trimming the stop token looks like what stop strings get
    (their text is trimmed unless no_stop_trim).

    Trigger: any request that finishes on a stop token id or an EOS token
    (not by max_new_tokens, not with ignore_eos). A stop token sampled first
    (at prefill) gives an empty output.

    Seen by (written blind): output_ids one token short (the matched stop
    token missing) and completion_tokens one lower than for the same request
    unpatched; the finish_reason still names the matched token. KV accounting
    stays consistent (the tail is released as overallocated).
    """
    name = "blind5_stop_token_trimmed"
    batch_module = find_module(SCHEDULE_BATCH, name)
    req_cls = find_attr(batch_module, "Req", name, f"{SCHEDULE_BATCH}.Req")
    original = find_method(req_cls, "_check_token_based_finish", name, ("new_accepted_tokens",))
    find_attr(req_cls, "output_ids_through_stop", name, "Req.output_ids_through_stop")

    def _check_token_based_finish(self, new_accepted_tokens):
        matched = original(self, new_accepted_tokens)
        if matched and self.finished_len is not None and self.finished_len > 0:
            self.finished_len -= 1  # MUTANT: `finished_len = matched_pos` (no + 1)
        return matched

    _check_token_based_finish.__name__ = _check_token_based_finish.__qualname__ = "_check_token_based_finish"
    replace_attr(req_cls, "_check_token_based_finish", _check_token_based_finish, original)


blind5_stop_token_trimmed = Patch(
    name="blind5_stop_token_trimmed",
    summary="a request finished by a stop token id or EOS gets finished_len = the stop token's position, so "
            "the stop token is missing from its output_ids",
    install=_install_stop_token_trimmed,
    topologies=ALL,
    expected="unknown (written blind): output_ids one token short (no stop token) and completion_tokens - 1 "
             "for requests that stop on stop_token_ids / EOS",
)


# --- 3. KV rows: the insert's duplicate slots are freed, the row still points at them --


def _install_dedup_row_not_repointed(scheduler_module: Any) -> None:
    """After a checkpoint that found its tokens already cached, the request's row keeps the freed duplicate slots.

    The bug: ``UnifiedRadixCache.checkpoint_into_tree`` inserts
    ``[cache_protected_len, up_to)`` of the request's row into the tree. Where
    another request inserted the same tokens first, the tree keeps its own
    slots and frees the request's copies (``FreeDeviceKV`` of the overlap past
    ``prev_prefix_len``). That is why it then rewrites the row::

        self.req_to_token_pool.write(
            (req.kv.req_pool_idx, slice(req.kv.cache_protected_len, len(new_indices))),
            new_indices[req.kv.cache_protected_len :],
        )

    The mutant behaves as if that write were missing for a request that keeps
    running (a prefill checkpoint or a chunk stash; a finishing request gives
    its row back right after, so there it would not matter): the row keeps
    the request's own, now freed, slots. ``cache_protected_len`` still moves
    up, so nothing is freed twice. Implemented by saving the row before the
    call and writing the saved range back after it.

    Why plausible: the rewrite looks like a no-op ("the row already holds
    these tokens"), because it only changes anything when the insert
    deduplicated.

    Trigger: two running requests whose prompts share tokens that neither
    found in the cache at admission (the same prompt twice in one prefill
    batch, or admitted before the other's checkpoint; also chunked prompts
    racing on a shared prefix). The second one to checkpoint has its copies
    freed. The row then reads freed slots for as long as it decodes.

    Seen by (written blind): nothing until the freed slots are handed out
    again (the free list is FIFO, so under KV pressure or after the pool has
    cycled): then the second request attends to another request's KV and its
    output diverges from the first one's (identical prompts, temperature 0,
    different outputs). No leak, no double free: SGLang's own idle check is
    silent.
    """
    name = "blind5_dedup_row_not_repointed"
    module = find_module(UNIFIED_RADIX_CACHE, name)
    cache_cls = find_attr(module, "UnifiedRadixCache", name, f"{UNIFIED_RADIX_CACHE}.UnifiedRadixCache")
    original = find_method(cache_cls, "checkpoint_into_tree", name, ("req", "up_to"))

    def checkpoint_into_tree(self, req, *, up_to, **kwargs):
        if getattr(self, "disable", False) or not req.kv.holds_kv or req.finished():
            return original(self, req, up_to=up_to, **kwargs)
        row = req.kv.req_pool_idx
        start = req.kv.cache_protected_len
        saved = self.req_to_token_pool.req_to_token[row, :up_to].clone()
        result = original(self, req, up_to=up_to, **kwargs)
        end = min(req.kv.cache_protected_len, up_to)
        if req.kv.holds_kv and req.kv.req_pool_idx == row and end > start:
            # MUTANT: the row is not repointed at the tree's slots
            self.req_to_token_pool.write((row, slice(start, end)), saved[start:end])
        return result

    checkpoint_into_tree.__name__ = checkpoint_into_tree.__qualname__ = "checkpoint_into_tree"
    replace_attr(cache_cls, "checkpoint_into_tree", checkpoint_into_tree, original)


blind5_dedup_row_not_repointed = Patch(
    name="blind5_dedup_row_not_repointed",
    summary="when a checkpoint finds the request's tokens already in the tree, the tree frees the "
            "request's duplicate KV slots but the request's req_to_token row keeps pointing at them",
    install=_install_dedup_row_not_repointed,
    topologies=ALL,
    expected="unknown (written blind): concurrent requests with the same uncached prompt diverge (one reads "
             "freed, reused KV slots) once the freed slots are reallocated (KV pressure); no leak",
)


# --- 4. KV rows: a continuing chunk is written one position early -------------------


def _install_chunk_resume_slot_shift(scheduler_module: Any) -> None:
    """A continuing chunk's new KV slots are written into its row starting one position early.

    The bug: ``ScheduleBatch.prepare_for_extend`` allocates the chunk's slots
    in ``alloc_for_extend``, which writes them into the request's row at
    ``[prefix_len, seq_len)`` (``write_cache_indices``; the prefix of a request
    that already holds its row is its own row). The mutant behaves as if, for a
    request resuming into a row it already holds (the second and later chunks
    of a chunked prompt), the write started at the last position the previous
    chunk wrote, ``[prefix_len - 1, seq_len - 1)``: position ``prefix_len - 1``
    now names the chunk's first new slot, every new token sits one position
    early, and position ``seq_len - 1`` keeps whatever the row held there
    before (0 for a never used row, a former owner's slot otherwise).
    Implemented by wrapping ``prepare_for_extend`` and shifting those rows
    after the original wrote them, before the forward.

    Why plausible: the resume offset is taken from "the last written
    position" (``kv_committed_len - 1``) instead of the next one, and only
    matters for the rare request that resumes into a row it already holds.

    Trigger: a prompt longer than one prefill chunk (with 64-token chunks:
    more than 64 uncached prompt tokens), from its second chunk on. Requests
    that fit in one chunk, fresh requests with a prefix hit, and decode are
    unaffected.

    Seen by (written blind): the chunked request's output is wrong (from the
    second chunk on its attention reads every token's KV one position off);
    the tree caches the shifted mapping, so later requests that reuse the
    prefix are wrong too. One KV slot per continuing chunk is lost and a stale
    slot is cached in its place, which balances SGLang's idle pool count (no
    leak reported); a stale slot that is live elsewhere is freed twice later.
    """
    name = "blind5_chunk_resume_slot_shift"
    batch_module = find_module(SCHEDULE_BATCH, name)
    batch_cls = find_attr(batch_module, "ScheduleBatch", name, f"{SCHEDULE_BATCH}.ScheduleBatch")
    original = find_method(batch_cls, "prepare_for_extend", name)
    find_attr(batch_module, "alloc_for_extend", name, f"{SCHEDULE_BATCH}.alloc_for_extend")

    def prepare_for_extend(self):
        pool = self.req_to_token_pool
        resumed = []
        for req in self.reqs:
            end = req.extend_end
            if (
                req.kv.holds_kv
                and not req.is_dllm()
                and req.prefix_len > 0
                and end is not None
                and end > req.prefix_len
            ):
                row = req.kv.req_pool_idx
                resumed.append((row, req.prefix_len, end, pool.req_to_token[row, end - 1].clone()))
        original(self)
        for row, start, end, stale in resumed:
            fresh = pool.req_to_token[row, start:end].clone()
            # MUTANT: the continuation is written from the last written position on
            pool.req_to_token[row, start - 1 : end - 1] = fresh
            pool.req_to_token[row, end - 1] = stale

    prepare_for_extend.__name__ = prepare_for_extend.__qualname__ = "prepare_for_extend"
    replace_attr(batch_cls, "prepare_for_extend", prepare_for_extend, original)


blind5_chunk_resume_slot_shift = Patch(
    name="blind5_chunk_resume_slot_shift",
    summary="a continuing prefill chunk's new KV slots are written into the request's row one position "
            "early (position prefix_len-1 overwritten, the chunk's last position left stale)",
    install=_install_chunk_resume_slot_shift,
    topologies=ALL,
    expected="unknown (written blind): wrong output for prompts longer than one chunk (and for later prefix "
             "hits on them); KV slot ownership corrupted without SGLang's idle check seeing it",
)


# --- 5. radix cache: every allocation evicts its full size ---------------------------


def _install_evict_ignores_free_space(scheduler_module: Any) -> None:
    """Every KV allocation evicts its full size from the radix tree, however much is free.

    The bug: ``BaseTokenToKVPoolAllocator.evict_to_free_tokens`` (reached from
    ``alloc_token_slots`` for every prefill and decode allocation, and from
    ``check_decode_capacity`` every decode step) evicts only the shortfall::

        shortfall = num_tokens - self.available_size()
        if shortfall > 0:
            tree_cache.evict_for_alloc(EvictParams(num_tokens=shortfall))

    The mutant behaves as if it asked the tree for ``num_tokens`` on every
    call (the free space is not subtracted): the least recently used unlocked
    cached tokens are evicted although the pool has plenty free. Implemented by
    evicting ``num_tokens`` before running the original (which then finds no
    shortfall). Locked prefixes (of running or admitted requests) are never
    evicted, so nothing in use is lost.

    Why plausible: a refactor of the shortfall computation (the SWA allocator
    computes ``max(0, num_tokens - available)`` per pool) that loses the
    subtraction still "works": outputs stay right and nothing leaks.

    Trigger: any traffic after a request has finished and left its prompt and
    output in the prefix cache: each later prefill evicts about its extend
    length, each decode step about twice the batch size, oldest first.

    Seen by (written blind): prefix-cache hits disappear: a prompt repeated
    after some other requests ran gets cached_tokens 0 (or a short hit) where
    the unpatched server, with free KV to spare, reuses the whole prefix. A
    back-to-back repeat still hits (its prefix is locked at admission).
    Outputs are unchanged; evictable size at idle is smaller than expected.
    """
    name = "blind5_evict_ignores_free_space"
    base_module = find_module(ALLOCATOR_BASE, name)
    allocator_cls = find_attr(base_module, "BaseTokenToKVPoolAllocator", name,
                              f"{ALLOCATOR_BASE}.BaseTokenToKVPoolAllocator")
    original = find_method(allocator_cls, "evict_to_free_tokens", name, ("tree_cache", "num_tokens"))
    evict_params = find_attr(find_module(BASE_PREFIX_CACHE, name), "EvictParams", name,
                             f"{BASE_PREFIX_CACHE}.EvictParams")

    def evict_to_free_tokens(self, tree_cache, num_tokens: int):
        if (
            tree_cache is not None
            and num_tokens > 0
            and tree_cache.supports_prefix_sharing()
        ):
            # MUTANT: the request size is evicted, not the shortfall
            tree_cache.evict_for_alloc(evict_params(num_tokens=num_tokens))
        return original(self, tree_cache, num_tokens)

    evict_to_free_tokens.__name__ = evict_to_free_tokens.__qualname__ = "evict_to_free_tokens"
    replace_attr(allocator_cls, "evict_to_free_tokens", evict_to_free_tokens, original)


blind5_evict_ignores_free_space = Patch(
    name="blind5_evict_ignores_free_space",
    summary="each KV allocation evicts its full size of cached tokens from the radix tree even when the "
            "pool has room, so the prefix cache drains under any traffic",
    install=_install_evict_ignores_free_space,
    topologies=ALL,
    expected="unknown (written blind): lost prefix-cache hits (cached_tokens 0 on a repeated prompt after "
             "other requests ran, with KV to spare); outputs and pool accounting unchanged",
)


# --- 6. admission: one request past the row budget ----------------------------------


def _install_admit_one_past_row_budget(scheduler_module: Any) -> None:
    """The prefill admission loop admits one request more than there are request rows / running slots.

    The bug: in ``Scheduler._get_new_batch_prefill_raw``, before each waiting
    request::

        if len(adder.can_run_list) >= self.get_num_allocatable_reqs(
            running_bs, candidate_beam_width, running_batch=running_batch,
            num_held_rows=num_held_rows,
        ):
            running_batch.batch_is_full = True

    ``get_num_allocatable_reqs`` is ``min(pp_max_micro_batch_size -
    running_bs, free req_to_token rows + held rows)``. The mutant behaves as if
    the comparison were ``>``: one request more than allocatable is admitted.
    Implemented by returning one more from ``get_num_allocatable_reqs`` when it
    is called from the loop (the only caller passing ``num_held_rows``); the
    early "no row at all" check before the loop is unchanged.

    Why plausible: ``>=`` vs ``>`` on a count that is compared *before* the
    candidate is added.

    Trigger: more waiting requests than free running slots (a burst larger
    than max_running_requests, or than the PP micro-batch size), with KV
    budget for all of them, while at least one slot is free.

    Seen by (written blind): ``alloc_req_slots`` cannot find a row for the
    extra request and raises "alloc_req_slots runs out of memory": the
    scheduler dies and every in-flight request is lost. Where the row pool is
    larger than the running limit (PP micro-batches), instead one request more
    than pp_max_micro_batch_size runs in a micro-batch.
    """
    name = "blind5_admit_one_past_row_budget"
    cls = scheduler_class(scheduler_module, name)
    original = find_method(cls, "get_num_allocatable_reqs", name, ("running_bs", "num_held_rows"))
    find_method(cls, "_get_new_batch_prefill_raw", name)

    def get_num_allocatable_reqs(self, *args, **kwargs):
        res = original(self, *args, **kwargs)
        if "num_held_rows" in kwargs:
            res += 1  # MUTANT: the loop's `>=` reads `>`
        return res

    get_num_allocatable_reqs.__name__ = get_num_allocatable_reqs.__qualname__ = "get_num_allocatable_reqs"
    replace_attr(cls, "get_num_allocatable_reqs", get_num_allocatable_reqs, original)


blind5_admit_one_past_row_budget = Patch(
    name="blind5_admit_one_past_row_budget",
    summary="prefill admission takes one request more than get_num_allocatable_reqs allows (free rows / "
            "max running requests)",
    install=_install_admit_one_past_row_budget,
    topologies=ALL,
    expected="unknown (written blind): a scheduler crash (alloc_req_slots out of rows) on a burst larger "
             "than the free running slots; or max_running_requests exceeded by one",
)


# --- 7. sessions: the previous turn's output is one token short ----------------------


def _install_session_history_drops_last_token(scheduler_module: Any) -> None:
    """A session continuation drops the last token of the previous turn's output when that turn hit max_new_tokens.

    The bug: ``Session._concat_token_arrays`` (every non-streaming session
    turn that appends to an earlier request, and replace/offset/
    drop_previous_output turns) builds the new prompt as::

        out_tail = last_req.output_ids[: last_req.sampling_params.max_new_tokens]
        input_ids = last_req.origin_input_ids + out_tail + req.input_ids

    (the slice drops tokens an overlapped step may have appended past the
    limit). The mutant behaves as if the slice bound were
    ``max_new_tokens - 1``. Implemented by running the original with the
    previous request's max_new_tokens lowered by one (restored right after).

    Why plausible: an off-by-one in a "trim the overshoot" slice, easy to
    write when thinking of the last sampled token as one whose KV was never
    computed.

    Trigger: a session (POST /open_session, then /generate with
    session_params) whose earlier turn finished by length (generated exactly
    max_new_tokens tokens) and a later turn appended after it. A turn that
    stopped early (stop token / EOS), drop_previous_output, and streaming
    sessions' plain appends are unaffected.

    Seen by (written blind): the continuation's prompt_tokens is one lower
    than len(previous prompt) + len(previous output) + len(new input), and its
    output differs from the same tokens sent as a plain request.
    """
    name = "blind5_session_history_drops_last_token"
    module = find_module(SESSION_CONTROLLER, name)
    session_cls = find_attr(module, "Session", name, f"{SESSION_CONTROLLER}.Session")
    if not isinstance(vars(session_cls).get("_concat_token_arrays"), staticmethod):
        raise missing_target(name, "the staticmethod Session._concat_token_arrays")
    original = find_method(session_cls, "_concat_token_arrays", name, ("last_req", "req", "session_params"))

    def _concat_token_arrays(last_req, req, session_params):
        sampling_params = last_req.sampling_params
        cap = sampling_params.max_new_tokens
        if cap is None or cap <= 0:
            return original(last_req, req, session_params)
        sampling_params.max_new_tokens = cap - 1  # MUTANT: out_tail = output_ids[: max_new_tokens - 1]
        try:
            return original(last_req, req, session_params)
        finally:
            sampling_params.max_new_tokens = cap

    _concat_token_arrays.__name__ = _concat_token_arrays.__qualname__ = "_concat_token_arrays"
    _concat_token_arrays.__wrapped__ = original
    setattr(session_cls, "_concat_token_arrays", staticmethod(_concat_token_arrays))


blind5_session_history_drops_last_token = Patch(
    name="blind5_session_history_drops_last_token",
    summary="a session turn appended after a turn that hit max_new_tokens loses that turn's last output "
            "token from its prompt",
    install=_install_session_history_drops_last_token,
    topologies=ALL,
    expected="unknown (written blind): session continuation with prompt_tokens one short and an output "
             "that differs from the equivalent plain request",
)


# --- 8. control: flush refused while paused with retracted requests queued -----------


def _install_paused_flush_refused(scheduler_module: Any) -> None:
    """While the engine is paused, ``flush_cache`` counts the queued (retracted) requests as busy and refuses.

    The bug: 0.5.23's ``Scheduler.flush_cache`` flushes only when
    ``self.is_fully_idle(ignore_waiting=self._engine_paused)``: during a pause,
    waiting requests (the ones a retract-mode pause put back in the queue)
    hold no KV and do not block a flush. The mutant behaves as if the call
    were ``self.is_fully_idle()``. Implemented by running ``flush_cache`` with
    ``_engine_paused`` read as False (restored right after; nothing else in
    the method reads it).

    Why plausible: the keyword looks like an odd special case; "flush only
    when nothing is queued" is the rule everywhere else (the deferred-flush
    wrapper calls ``is_fully_idle()`` plainly).

    Trigger: the weight-update workflow: POST /pause_generation with
    mode="retract" while requests are running or queued, then /flush_cache or
    /update_weights_from_disk (which flushes after loading), before
    /continue_generation. With an empty queue the flush succeeds as before.

    Seen by (written blind): /flush_cache answers success=false; a weight
    update answers success=false ("Weights were updated, but the cache was not
    flushed ...") although the weights changed; the prefix cache keeps KV
    computed by the old weights, so after continue the resumed and new
    requests reuse stale prefixes.
    """
    name = "blind5_paused_flush_refused"
    cls = scheduler_class(scheduler_module, name)
    original = find_method(cls, "flush_cache", name, ("empty_cache",))
    find_method(cls, "is_fully_idle", name, ("ignore_waiting",))
    find_method(cls, "pause_generation", name, ("recv_req",))

    def flush_cache(self, *args, **kwargs):
        own = vars(self)
        if "_engine_paused" not in own:
            return original(self, *args, **kwargs)
        paused = own["_engine_paused"]
        self._engine_paused = False  # MUTANT: is_fully_idle() without ignore_waiting
        try:
            return original(self, *args, **kwargs)
        finally:
            self._engine_paused = paused

    flush_cache.__name__ = flush_cache.__qualname__ = "flush_cache"
    replace_attr(cls, "flush_cache", flush_cache, original)


blind5_paused_flush_refused = Patch(
    name="blind5_paused_flush_refused",
    summary="flush_cache during a pause refuses when retracted requests are queued (the waiting queue is "
            "no longer ignored while paused), failing /flush_cache and weight updates",
    install=_install_paused_flush_refused,
    topologies=ALL,
    expected="unknown (written blind): success=false from /flush_cache or /update_weights_from_disk after "
             "a retract-mode pause with requests queued; stale prefix KV after continue",
)


# --- 9. overlap loop: requests whose last token is not in flight are skipped ---------


def _install_finishing_skip_not_inflight(scheduler_module: Any) -> None:
    """The overlap loop drops from the running batch requests it wrongly thinks the queued result finishes.

    The bug: under the overlap loop (``enable_skip_finishing_decode``),
    ``Scheduler._reqs_finishing_inflight`` lists the running requests whose
    next committed token reaches max_new_tokens *and that are in the batch
    whose result is still queued* (``req in queued_reqs``):
    ``update_running_batch`` filters them out of the decode batch, because the
    queued result will finish them. The mutant drops the ``req in
    queued_reqs`` condition: a request that is not in the queued batch (when
    the batch in flight is another request's prefill) and needs exactly one
    more token is filtered out too, although nothing in flight will produce
    that token. Implemented by appending those requests to the original list.

    Why plausible: the membership test looks redundant ("every running
    request is in the last batch"), which is true between two decode steps
    and false right after a prefill batch of other requests.

    Trigger: overlap scheduling (pp1-overlap); a request one token short of
    max_new_tokens at the moment another request's prefill is the queued
    batch (a new request arriving while others decode, or a chunk of a long
    prompt). The warm-up request (alone) is unaffected.

    Seen by (written blind): the request never finishes (the client hangs
    until its timeout) and is gone from the running batch; its KV and
    req_to_token row stay allocated, so once the server is otherwise idle
    SGLang's idle pool check finds them unaccounted for and, with its default
    strict setting, raises: a scheduler crash.
    """
    name = "blind5_finishing_skip_not_inflight"
    cls = scheduler_class(scheduler_module, name)
    original = find_method(cls, "_reqs_finishing_inflight", name, ("batch",))
    find_method(cls, "update_running_batch", name, ("batch",))
    batch_module = find_module(SCHEDULE_BATCH, name)
    req_cls = find_attr(batch_module, "Req", name, f"{SCHEDULE_BATCH}.Req")
    find_method(req_cls, "next_output_finishes_by_length", name)

    def _reqs_finishing_inflight(self, batch):
        finishing = original(self, batch)
        if not self.enable_skip_finishing_decode or not self.result_queue:
            return finishing
        listed = set(finishing)
        extra = [
            req
            for req in batch.reqs
            if req not in listed  # MUTANT: `req in queued_reqs` dropped
            and req.beam_group is None
            and req.next_output_finishes_by_length()
        ]
        return finishing + extra

    _reqs_finishing_inflight.__name__ = _reqs_finishing_inflight.__qualname__ = "_reqs_finishing_inflight"
    replace_attr(cls, "_reqs_finishing_inflight", _reqs_finishing_inflight, original)


blind5_finishing_skip_not_inflight = Patch(
    name="blind5_finishing_skip_not_inflight",
    summary="overlap loop: a request one token short of max_new_tokens is dropped from the decode batch "
            "as 'finishing in flight' when the queued batch is someone else's prefill",
    install=_install_finishing_skip_not_inflight,
    topologies=OVERLAP,
    expected="unknown (written blind): a request that never finishes (hang/timeout) when another request's "
             "prefill lands as it needs its last token; then SGLang's strict idle leak check raises",
)


# --- 10. PP loop: a micro-batch's outdated chunked_req is merged ---------------------


def _install_pp_stale_chunk_merged(scheduler_module: Any) -> None:
    """Under PP, a micro-batch merges the chunked request of its earlier chunk although another micro-batch finished it.

    The bug: ``Scheduler.get_next_batch_to_run`` filters the last prefill
    batch before merging it into the running batch, excluding the current
    ``self.chunked_req`` and::

        if last_batch.chunked_req is not None:
            # In the context pipeline parallelism, after the last chunk, the
            # current microbatch still track outdated chunked_req.
            reqs_to_exclude.add(last_batch.chunked_req)

    The mutant behaves as if that exclusion were missing. At pp=1 it changes
    nothing (the outdated chunked request is still ``self.chunked_req`` when
    its earlier chunk's batch is merged); under PP the next chunk runs in the
    next micro-batch, so when micro-batch k merges its earlier-chunk batch the
    request has already finished its prefill elsewhere and is merged into
    micro-batch k's running batch as well. Implemented by clearing that
    batch's ``chunked_req`` for the duration of the call when it is not the
    current ``self.chunked_req`` (restored after).

    Why plausible: ``self.chunked_req`` is already excluded a few lines above,
    and the second exclusion reads as a duplicate.

    Trigger: pp>1 (the pp4 topology) and a prompt that needs more than one
    prefill chunk (more than 64 uncached prompt tokens with 64-token chunks).

    Seen by (written blind): the request decodes in two micro-batches, one of
    them with its earlier chunk's seq_len and row offsets: extra and wrong
    output tokens, a KV row overwritten mid-prompt, KV slots lost or freed
    twice (SGLang's strict idle pool check may raise, or a later allocation
    fails).
    """
    name = "blind5_pp_stale_chunk_merged"
    cls = scheduler_class(scheduler_module, name)
    original = find_method(cls, "get_next_batch_to_run", name, ("running_batch", "last_batch"))
    find_method(cls, "event_loop_pp", name)
    batch_module = find_module(SCHEDULE_BATCH, name)
    batch_cls = find_attr(batch_module, "ScheduleBatch", name, f"{SCHEDULE_BATCH}.ScheduleBatch")
    fields = getattr(batch_cls, "__dataclass_fields__", {})
    if "chunked_req" not in fields:
        raise missing_target(name, "ScheduleBatch.chunked_req")

    def get_next_batch_to_run(self, running_batch, last_batch):
        stale = None
        if (
            last_batch is not None
            and last_batch.forward_mode.is_extend()
            and last_batch.chunked_req is not None
            and last_batch.chunked_req is not self.chunked_req
        ):
            stale = last_batch.chunked_req
            last_batch.chunked_req = None  # MUTANT: the outdated chunked_req is not excluded
        try:
            return original(self, running_batch=running_batch, last_batch=last_batch)
        finally:
            if stale is not None:
                last_batch.chunked_req = stale

    get_next_batch_to_run.__name__ = get_next_batch_to_run.__qualname__ = "get_next_batch_to_run"
    replace_attr(cls, "get_next_batch_to_run", get_next_batch_to_run, original)


blind5_pp_stale_chunk_merged = Patch(
    name="blind5_pp_stale_chunk_merged",
    summary="PP loop: a micro-batch merges its earlier chunk's request into its running batch after "
            "another micro-batch finished that prompt, so the request runs in two micro-batches",
    install=_install_pp_stale_chunk_merged,
    topologies=PP4,
    expected="unknown (written blind): wrong/extra output tokens for a chunked prompt under pp4, with "
             "KV slots lost or double-freed (a strict idle leak raise or a later allocation failure)",
)


ALL_BLIND5 = (
    "blind5_abort_misses_unmerged_prefill",
    "blind5_stop_token_trimmed",
    "blind5_dedup_row_not_repointed",
    "blind5_chunk_resume_slot_shift",
    "blind5_evict_ignores_free_space",
    "blind5_admit_one_past_row_budget",
    "blind5_session_history_drops_last_token",
    "blind5_paused_flush_refused",
    "blind5_finishing_skip_not_inflight",
    "blind5_pp_stale_chunk_merged",
)

