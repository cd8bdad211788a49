"""Blind mutant set 3 for SGLang 0.5.23's scheduler path (issue 34).

Kept as external patches, the way they were measured (bench/README.md, "The
third blind set"); run one with, for example:

    scripted-runtime mutate --topology pp4 --no-corpus \
        --patch bench/blind_mutants/blind3_mutants.py:blind3_pp_last_mb_extend_only

Written by a helper author in one sitting on 2026-11-27, before the pp4
grammar change it then prompted (``Start.beside``); not edited since.

Written from SGLang's own source only, without reading the harness's checks,
explorer, corpus, tests or check docs. Each mutant is a ``Patch`` whose
``install(scheduler_module)`` monkeypatches one spot of SGLang by wrapping the
original (``__wrapped__`` keeps it); one (``blind3_reject_pin_leak``) copies a
16-line context manager faithfully with its change marked ``# MUTANT:`` and
checks the copied source's digest first.

Every install raises ``PatchError`` ("... written against SGLang 0.5.23") when
its target is missing. None uses randomness or timing, and none touches the
server's warm-up request (one short prompt, a few tokens, a single request,
no abort/pause/flush/chunking/stop string).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any

from scripted_runtime.hooks.mutants.base import (
    check_copied_body,
    find_attr,
    find_method,
    find_module,
    replace_attr,
    scheduler_class,
)
from scripted_runtime.hooks.patch_base import Patch, PatchError

RELEASE = "0.5.23"
ALL = ("pp1-overlap", "pp1-normal", "pp4")
PP4 = ("pp4",)

SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch"
SCHEDULE_POLICY = "sglang.srt.managers.schedule_policy"
MEMORY_POOL = "sglang.srt.mem_cache.memory_pool"


# --- 1. chunked prefill: a continuing middle chunk is not counted in flight ----------


def _install_middle_chunk_uncounted(scheduler_module: Any) -> None:
    """Continuing middle chunks of a chunked prompt are not counted in flight.

    The bug: at the end of ``Scheduler._get_new_batch_prefill_raw`` 0.5.23 does::

        if adder.new_chunked_req is not None:
            assert self.chunked_req is None
            self.chunked_req = adder.new_chunked_req

        if self.chunked_req is not None:
            self.chunked_req.inflight_middle_chunks += 1

    The mutant behaves as if the increment had been indented into the
    ``new_chunked_req`` block: only the chunk that *makes* a request chunked is
    counted; a later chunk that still leaves the prompt unfinished (a middle
    chunk scheduled from ``self.chunked_req``) is not. Implemented by wrapping
    the method and undoing the increment when the chunked request that leaves
    the pass is the one that entered it.

    Why plausible: a one-level indentation slip in a block that is rewritten
    often (PP and overlap both rely on this counter since middle chunks can be
    in flight in several micro-batches), and the increment reads naturally as
    part of "a request became chunked".

    Trigger: a prompt that needs at least three chunks (with chunk size 64:
    more than 128 prompt tokens, not served from the prefix cache), so that one
    of its chunks is a continuing middle chunk. Prompts of one or two chunks
    (and the warm-up request) are unaffected.

    What a correct observer sees: the result of the second chunk is taken as
    the end of the prompt, so a bogus first output token (the model's guess
    for prompt token 129) is committed and streamed, and the rest of the
    answer is conditioned on it: the output differs from a run without
    chunking. With max_new_tokens=1 the request finishes on that middle chunk
    while it is still the chunked request; the next pass checkpoints a
    finished request and the scheduler dies on SGLang's own assertion.
    """
    cls = scheduler_class(scheduler_module, "blind3_middle_chunk_uncounted")
    original = find_method(cls, "_get_new_batch_prefill_raw", "blind3_middle_chunk_uncounted",
                           ("prefill_delayer_single_pass", "running_batch"))

    def _get_new_batch_prefill_raw(self, *args, **kwargs):
        entering = self.chunked_req
        new_batch, running_batch = original(self, *args, **kwargs)
        leaving = self.chunked_req
        if new_batch is not None and leaving is not None and leaving is entering:
            # MUTANT: a continuing (middle) chunk is not counted as in flight
            leaving.inflight_middle_chunks -= 1
        return new_batch, running_batch

    _get_new_batch_prefill_raw.__name__ = _get_new_batch_prefill_raw.__qualname__ = "_get_new_batch_prefill_raw"
    replace_attr(cls, "_get_new_batch_prefill_raw", _get_new_batch_prefill_raw, original)


blind3_middle_chunk_uncounted = Patch(
    name="blind3_middle_chunk_uncounted",
    summary="a continuing middle chunk of a chunked prompt is not counted in inflight_middle_chunks "
            "(only the chunk that makes a request chunked is)",
    install=_install_middle_chunk_uncounted,
    topologies=ALL,
    expected="unknown (written blind): a wrong output (a bogus first token for prompts of 3+ chunks), "
             "or a scheduler crash on SGLang's checkpoint assertion when such a prompt has max_new_tokens=1",
)


# --- 2. PP micro-batch bookkeeping: last_mbs only remembers extend batches -----------


class _ExtendOnlyLastMbs(list):
    """``Scheduler.last_mbs`` as the mutant keeps it: a slot is overwritten
    only by an extend micro-batch; a decode (or idle) one leaves the previous
    entry in place."""

    def __setitem__(self, index, value):
        if (
            value is not None
            and not isinstance(index, slice)
            and not value.forward_mode.is_extend()
        ):
            return  # MUTANT: last_mbs[i] is updated only after an extend batch
        super().__setitem__(index, value)


def _install_pp_last_mb_extend_only(scheduler_module: Any) -> None:
    """PP: a micro-batch slot's ``last_mbs`` entry is only updated after a prefill.

    The bug: in ``event_loop_pp``, after processing micro-batch ``next_mb_id``
    0.5.23 does ``self.last_mbs[next_mb_id] = self.mbs[next_mb_id]``. The
    mutant behaves as if that line were guarded by
    ``if self.mbs[next_mb_id].forward_mode.is_extend():``, so after a decode
    micro-batch the slot still names the last *prefill* batch it ran.
    Implemented by wrapping ``init_pp_loop_state`` and replacing ``last_mbs``
    with a list whose item assignment ignores non-extend batches (the loop
    body itself is untouched).

    Why plausible: ``get_next_batch_to_run`` only merges ``last_batch`` when it
    is an extend batch, so "only prefill batches need remembering" reads like
    a harmless simplification of the per-micro-batch bookkeeping.

    Trigger (pp4 only): a request's prefill runs in a micro-batch whose
    running batch already holds decoding requests (a second request admitted
    into a busy micro-batch), and that micro-batch then runs a decode step.
    The stale prefill batch comes back as ``last_batch`` on every later turn
    of that micro-batch and is filtered and merged into the running batch
    again. A lone request (the warm-up) is unaffected: its prefill batch
    becomes the running batch itself and turns into a decode batch.

    What a correct observer sees: the re-merged requests appear several times
    in their running batch, are decoded several times per step (repeated
    tokens, wrong outputs), and at their finish their KV is released twice
    (SGLang's release assertion kills the scheduler).
    """
    cls = scheduler_class(scheduler_module, "blind3_pp_last_mb_extend_only")
    original = find_method(cls, "init_pp_loop_state", "blind3_pp_last_mb_extend_only")
    find_method(cls, "event_loop_pp", "blind3_pp_last_mb_extend_only")

    def init_pp_loop_state(self):
        ret = original(self)
        last_mbs = getattr(self, "last_mbs", None)
        if not isinstance(last_mbs, list):
            raise PatchError("blind3_pp_last_mb_extend_only: init_pp_loop_state set no last_mbs list; "
                             f"written against SGLang {RELEASE}")
        self.last_mbs = _ExtendOnlyLastMbs(last_mbs)
        return ret

    init_pp_loop_state.__name__ = init_pp_loop_state.__qualname__ = "init_pp_loop_state"
    replace_attr(cls, "init_pp_loop_state", init_pp_loop_state, original)


blind3_pp_last_mb_extend_only = Patch(
    name="blind3_pp_last_mb_extend_only",
    summary="PP: last_mbs[i] is updated only after an extend micro-batch, so a stale prefill batch is "
            "merged into its micro-batch's running batch again on every later turn",
    install=_install_pp_last_mb_extend_only,
    topologies=PP4,
    expected="unknown (written blind): wrong outputs (requests decoded several times per step) and a "
             "crash on SGLang's double-release assertion when they finish",
)


# --- 3. radix-cache lock: admission's temporary pin leaks when the request is turned away


_LOCK_NODE_DIGEST = "5603cdeb8a293bbb"  # PrefillAdder._lock_node, SGLang 0.5.23


def _install_reject_pin_leak(scheduler_module: Any) -> None:
    """Admission's temporary prefix pin is released only when the request is admitted.

    The bug: ``PrefillAdder.add_one_req`` wraps the budget selection in
    ``with self._lock_node(req.last_node):`` so that the request's matched
    prefix is not counted as evictable while its admission is decided; the
    context manager always unlocks on exit. In the mutant the unlock only runs
    when the pinned request was admitted (``can_run_list`` grew inside the
    block); on every rejection path (not enough KV budget, NO_TOKEN, or any
    OTHER verdict reached inside the block) the pin stays. The host-pin
    variant (``lock_host=True``, HiCache load-back) is unchanged. This copies
    the 0.5.23 body (digest-checked) with one change marked ``# MUTANT:``.

    Why plausible: a refactor that "hands the admission pin over" to the
    request's own lock in ``_commit_prefill_admission`` (or that restructures
    the early returns inside the ``with`` block into explicit lock/unlock
    calls) naturally releases it only on the success path.

    Trigger: KV pressure while a queued request whose prompt matches a cached
    prefix (a shared system prompt, a repeated prompt) is turned away by
    admission for lack of KV budget; each scheduling pass that turns it away
    leaks one more lock on its matched node. A request matching nothing locks
    only the root, which is never evictable.

    What a correct observer sees: at idle the radix tree still has locked
    (protected) nodes and less evictable KV than it caches; under continued
    pressure that prefix can never be evicted, so later requests are refused
    or retracted more than they should be (possibly a stall). SGLang's own
    idle pool identity (available + evictable + protected == total) still
    holds, so only a lock/protected-size or evictability check notices.
    """
    name = "blind3_reject_pin_leak"
    policy = find_module(SCHEDULE_POLICY, name)
    adder = find_attr(policy, "PrefillAdder", name, f"{SCHEDULE_POLICY}.PrefillAdder")
    original = find_method(adder, "_lock_node", name, ("last_node", "lock_host"))
    find_method(adder, "add_one_req", name)
    check_copied_body(original, _LOCK_NODE_DIGEST, name, "PrefillAdder._lock_node")

    @contextmanager
    def _lock_node(self, last_node, *, lock_host: bool = False):
        host_lock_params = (
            self.tree_cache.inc_host_lock_ref(last_node).to_dec_params()
            if lock_host
            else None
        )
        try:
            lock = self.tree_cache.lock(last_node)
            num_admitted = len(self.can_run_list)  # MUTANT: remembered for the unlock below
            try:
                yield None
            finally:
                # MUTANT: the admission pin is released only if the pinned request was admitted
                if lock_host or len(self.can_run_list) > num_admitted:
                    self.tree_cache.unlock(lock)
        finally:
            if host_lock_params is not None:
                self.tree_cache.dec_host_lock_ref(last_node, host_lock_params)

    _lock_node.__name__ = _lock_node.__qualname__ = "_lock_node"
    replace_attr(adder, "_lock_node", _lock_node, original)


blind3_reject_pin_leak = Patch(
    name="blind3_reject_pin_leak",
    summary="admission's temporary lock on a queued request's matched prefix is never released when "
            "the request is turned away (KV budget), so the prefix stays locked",
    install=_install_reject_pin_leak,
    topologies=ALL,
    expected="unknown (written blind): a radix-lock leak: locked/protected prefix nodes at idle and KV "
             "that is cached but never evictable (later admissions starved under KV pressure)",
)


# --- 4. flush handler: the tree is reset but the KV allocator is not ---------------


def _install_flush_keeps_kv_slots(scheduler_module: Any) -> None:
    """``flush_cache`` resets the radix tree but not the KV slot allocator.

    The bug: 0.5.23's ``Scheduler.flush_cache`` (when fully idle) does
    ``tree_cache.reset()``, ``req_to_token_pool.clear()`` and
    ``token_to_kv_pool_allocator.clear()``. The tree's reset only drops its
    nodes; it does not hand their KV slots back, which is what the allocator's
    ``clear()`` is for. The mutant runs ``flush_cache`` with the allocator's
    ``clear`` turned into a no-op, i.e. the line is dropped.

    Why plausible: the three resets look redundant ("resetting the tree frees
    what it cached"), and a refactor that moves pool resets behind the tree
    cache (as the unified-memory pools do) can lose this one for the plain
    allocator.

    Trigger: any successful flush (POST /flush_cache, or a weight update /
    memory release that flushes through ``flush_cache``) after at least one
    request has finished and left its prompt/output in the prefix cache. Every
    handler that flushes goes through this method, on every PP rank.

    What a correct observer sees: after the flush the KV slots the tree held
    are neither free, evictable nor protected: free KV drops by the cached
    size on every flush. SGLang's own idle pool check reports the leak (with
    its default strict setting it raises, so the scheduler dies at the next
    idle); repeated flushes shrink the pool until requests are refused.
    """
    cls = scheduler_class(scheduler_module, "blind3_flush_keeps_kv_slots")
    original = find_method(cls, "flush_cache", "blind3_flush_keeps_kv_slots", ("empty_cache",))

    def _keep_slots(*args, **kwargs) -> None:
        return None

    def flush_cache(self, *args, **kwargs):
        allocator = self.token_to_kv_pool_allocator
        own = vars(allocator)
        shadowed = "clear" in own
        saved = own.get("clear")
        allocator.clear = _keep_slots  # MUTANT: the allocator is not reset with the tree
        try:
            return original(self, *args, **kwargs)
        finally:
            if shadowed:
                allocator.clear = saved
            else:
                del allocator.clear

    flush_cache.__name__ = flush_cache.__qualname__ = "flush_cache"
    replace_attr(cls, "flush_cache", flush_cache, original)


blind3_flush_keeps_kv_slots = Patch(
    name="blind3_flush_keeps_kv_slots",
    summary="flush_cache resets the radix tree but not the KV allocator: every slot the tree held is lost",
    install=_install_flush_keeps_kv_slots,
    topologies=ALL,
    expected="unknown (written blind): a KV-slot leak after each flush of a non-empty cache (free KV "
             "drops; SGLang's strict idle check raises, i.e. a scheduler crash at the next idle)",
)


# --- 5. KV row handling: a multi-row allocation leaves one row on the free list ------


def _install_row_alloc_shares_row(scheduler_module: Any) -> None:
    """``ReqToTokenPool.alloc_rows(n)`` with n > 1 leaves the first handed-out row free.

    The bug: 0.5.23 pops rows from the tail::

        select_index = self.free_slots[-need_size:]
        del self.free_slots[-need_size:]

    The mutant removes one row too few from the free list (as
    ``del self.free_slots[len(self.free_slots) - need_size + 1:]`` would):
    ``select_index[0]`` is handed out and still listed as free, at the tail,
    so the very next row allocation hands it out again. Implemented by
    wrapping ``alloc_rows`` and putting ``select_index[0]`` back at the tail
    when more than one row was taken. A single-row allocation (the warm-up,
    or any prefill batch that admits one new request) is exact.

    Why plausible: an off-by-one in an "O(need_size) tail pop" rewrite of the
    row allocator that only shows with several rows at once.

    Trigger: a prefill batch that admits two or more new requests at once
    (several requests queued together), followed by another request admitted
    while the first of them is still running; on pp4 any micro-batch's
    prefill with two new requests does.

    What a correct observer sees: two live requests share one req_to_token
    row, so one overwrites the other's KV locations: wrong outputs for one or
    both. When both finish the row is freed twice, so the row pool holds more
    free rows than it has (SGLang's idle req-pool check reports it, strict by
    default: a crash) and the duplicate is handed out again later.
    """
    name = "blind3_row_alloc_shares_row"
    pool_module = find_module(MEMORY_POOL, name)
    pool = find_attr(pool_module, "ReqToTokenPool", name, f"{MEMORY_POOL}.ReqToTokenPool")
    original = find_method(pool, "alloc_rows", name, ("need_size",))

    def alloc_rows(self, need_size):
        select_index = original(self, need_size)
        if select_index is not None and len(select_index) > 1:
            # MUTANT: one row too few is taken off the free list
            self.free_slots.append(select_index[0])
        return select_index

    alloc_rows.__name__ = alloc_rows.__qualname__ = "alloc_rows"
    replace_attr(pool, "alloc_rows", alloc_rows, original)


blind3_row_alloc_shares_row = Patch(
    name="blind3_row_alloc_shares_row",
    summary="a multi-row req_to_token allocation leaves its first row on the free list: the next "
            "request gets the same row while its owner is alive",
    install=_install_row_alloc_shares_row,
    topologies=ALL,
    expected="unknown (written blind): wrong outputs (two requests share a req_to_token row) and a "
             "req-pool accounting error at idle (row freed twice; SGLang's strict check raises)",
)


# --- 6. abort: a retracted (already started) queued request is not aborted --------


def _install_abort_spares_retracted(scheduler_module: Any) -> None:
    """Abort skips queued requests that have already produced output (retracted ones).

    The bug: ``Scheduler.abort_request`` first pops matching requests from the
    waiting queue ("Abort method 1 ... only works for requests that have not
    started anything"), then marks matching requests in the in-flight batches
    with ``to_finish``. A request that was retracted (KV pressure, or
    ``pause_generation(mode="retract")``) sits in the waiting queue with its
    output so far and is in no running batch. The mutant hides queued requests
    that have output from the waiting-queue sweep, as a guard like
    ``if req.output_ids: continue`` (taken from that comment) would; they are
    put back in their queue order afterwards.

    Why plausible: the comment invites exactly that guard ("started requests
    are handled by method 3"), but method 3 only scans the running/in-flight
    batches, which a retracted request has left.

    Trigger: abort a request (by rid, or abort_all, e.g. pause(mode="abort"))
    while it is retracted: after a ``pause_generation(mode="retract")`` and
    before ``continue_generation``, or while it waits to resume after a
    KV-pressure retraction. Aborts of never-started queued requests and of
    running ones are unaffected.

    What a correct observer sees: the abort is lost: no abort reply, the
    request resumes after the pause / when KV frees up and finishes normally
    (finish reason length or stop instead of abort), doing work it was told to
    drop.
    """
    cls = scheduler_class(scheduler_module, "blind3_abort_spares_retracted")
    original = find_method(cls, "abort_request", "blind3_abort_spares_retracted", ("recv_req",))

    def abort_request(self, recv_req):
        queue = self.waiting_queue
        started = [req for req in queue if len(req.output_ids) > 0]
        if not started:
            return original(self, recv_req)
        # MUTANT: queued requests that already produced output are not swept
        self.waiting_queue = [req for req in queue if len(req.output_ids) == 0]
        try:
            return original(self, recv_req)
        finally:
            order = {id(req): i for i, req in enumerate(queue)}
            merged = list(self.waiting_queue) + started
            merged.sort(key=lambda req: order.get(id(req), len(queue)))
            self.waiting_queue = merged

    abort_request.__name__ = abort_request.__qualname__ = "abort_request"
    replace_attr(cls, "abort_request", abort_request, original)


blind3_abort_spares_retracted = Patch(
    name="blind3_abort_spares_retracted",
    summary="abort does not sweep queued requests that already have output (retracted by pause or KV "
            "pressure): the abort is lost and they later finish normally",
    install=_install_abort_spares_retracted,
    topologies=ALL,
    expected="unknown (written blind): a lost abort: an aborted, retracted request gets no abort and "
             "finishes normally after resume (wrong finish reason)",
)


# --- 7. stop conditions: a stop string is searched in the newest token only --------


def _install_stop_str_newest_token(scheduler_module: Any) -> None:
    """The stop-string search window shrinks to the newly accepted token(s).

    The bug: ``Req._stop_match_tail_len(new_accepted_len)`` sizes the tail of
    ``output_ids`` that ``tail_str`` decodes for the stop-string / stop-regex
    check: the longest stop string's token length + 1, widened by the extra
    tokens a speculative step accepted. The mutant returns only
    ``max(new_accepted_len, 1)`` tokens (never more than the original), so
    only the text of the newest token is searched.

    Why plausible: a performance change ("decode only the newly accepted
    tokens each step instead of a sliding window") that forgets a stop string
    can straddle the boundary between the previous tokens and the new one.

    Trigger: a request with a stop string (or stop regex) whose match in the
    generated text spans two or more tokens, e.g. a multi-word stop string;
    a stop string that falls inside one token is still found. Requests
    without stop strings (the warm-up) are untouched.

    What a correct observer sees: the request does not stop at the stop
    string; it runs on to max_new_tokens (finish reason length, not stop),
    and the returned text contains the stop string and what follows it.
    Streaming hold-back of partial stop-string prefixes also weakens.
    """
    name = "blind3_stop_str_newest_token"
    batch_module = find_module(SCHEDULE_BATCH, name)
    req_cls = find_attr(batch_module, "Req", name, f"{SCHEDULE_BATCH}.Req")
    original = find_method(req_cls, "_stop_match_tail_len", name, ("new_accepted_len",))
    find_method(req_cls, "tail_str", name)

    def _stop_match_tail_len(self, new_accepted_len):
        window = original(self, new_accepted_len)
        # MUTANT: only the newly accepted token(s) are searched for a stop string
        return min(window, max(new_accepted_len, 1))

    _stop_match_tail_len.__name__ = _stop_match_tail_len.__qualname__ = "_stop_match_tail_len"
    replace_attr(req_cls, "_stop_match_tail_len", _stop_match_tail_len, original)


blind3_stop_str_newest_token = Patch(
    name="blind3_stop_str_newest_token",
    summary="the stop-string check decodes only the newest token: a stop string spanning tokens is "
            "never matched",
    install=_install_stop_str_newest_token,
    topologies=ALL,
    expected="unknown (written blind): a wrong output: a request with a multi-token stop string runs "
             "past it to max_new_tokens (finish reason length, stop string in the text)",
)


# --- 8. admission budget: a continuing chunk is not charged to the chunk budget -----


def _install_chunk_budget_skips_continuation(scheduler_module: Any) -> None:
    """A continuing chunk does not consume the pass's chunked-prefill token budget.

    The bug: ``PrefillAdder.add_chunked_req`` schedules the next chunk of the
    request being chunked and charges it (``_update_prefill_budget``) against
    ``rem_chunk_tokens``, so a full 64-token chunk leaves no room for anyone
    else in that prefill pass. The mutant restores ``rem_chunk_tokens`` after
    the continuing chunk is added (its KV reservation is still made): the
    waiting queue is then admitted against a fresh chunk budget.

    Why plausible: "the continuing chunk was budgeted when the request was
    first admitted" is an easy wrong belief, and skipping the charge looks
    like a fairness improvement (waiting requests join the pass).

    Trigger: a request is queued while a long prompt is mid-way through
    chunked prefill. A short queued prompt is admitted into the same pass
    (the prefill batch exceeds the chunk size, outputs still right); a queued
    prompt longer than the chunk size is itself chunked while the first is
    still chunked, which SGLang does not support. The simplest shape: a prompt
    of more than two chunks (> 128 tokens) and another of more than one chunk
    (> 64 tokens) sent together (the second is chunked on the first's second
    chunk).

    What a correct observer sees: prefill batches larger than the chunked
    prefill size, and with two long prompts the scheduler dies on SGLang's
    ``assert self.chunked_req is None`` (all requests lost, the server gone).
    """
    name = "blind3_chunk_budget_skips_continuation"
    policy = find_module(SCHEDULE_POLICY, name)
    adder = find_attr(policy, "PrefillAdder", name, f"{SCHEDULE_POLICY}.PrefillAdder")
    original = find_method(adder, "add_chunked_req", name, ("req",))

    def add_chunked_req(self, req):
        budget_before = self.rem_chunk_tokens
        num_before = len(self.can_run_list)
        ret = original(self, req)
        if budget_before is not None and len(self.can_run_list) > num_before:
            # MUTANT: the continuing chunk is not charged to the chunk budget
            self.rem_chunk_tokens = budget_before
        return ret

    add_chunked_req.__name__ = add_chunked_req.__qualname__ = "add_chunked_req"
    replace_attr(adder, "add_chunked_req", add_chunked_req, original)


blind3_chunk_budget_skips_continuation = Patch(
    name="blind3_chunk_budget_skips_continuation",
    summary="a continuing chunk is not charged to rem_chunk_tokens: waiting requests are admitted "
            "against a fresh chunk budget (a second request can be chunked concurrently)",
    install=_install_chunk_budget_skips_continuation,
    topologies=ALL,
    expected="unknown (written blind): a scheduler crash (SGLang's one-chunked-request assertion) when "
             "two long prompts overlap; oversized prefill batches otherwise",
)


ALL_BLIND3 = (
    "blind3_middle_chunk_uncounted",
    "blind3_pp_last_mb_extend_only",
    "blind3_reject_pin_leak",
    "blind3_flush_keeps_kv_slots",
    "blind3_row_alloc_shares_row",
    "blind3_abort_spares_retracted",
    "blind3_stop_str_newest_token",
    "blind3_chunk_budget_skips_continuation",
)
