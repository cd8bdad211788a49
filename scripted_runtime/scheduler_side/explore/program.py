"""Helpers that explored programs (and the scenario files written from them)
call, next to the plain context API. They run in the scheduler process.

Each one is deterministic in iterations: what it does depends only on
scheduler state, never on wall-clock timing, so a program replays the same
way on the same build.
"""
from __future__ import annotations

import inspect
import time

from typing import Any, Dict, List, Optional, Sequence, Tuple

from scripted_runtime.hooks import sglang_compat
from scripted_runtime.scheduler_side import (answer_delivery, control, hicache_state, output_oracle, request_contract,
                                             request_fuzz, state, stop_strings)
from scripted_runtime.scheduler_side import logprob_contract  # after request_contract: the end checks' listed order
from scripted_runtime.scheduler_side import weight_version_contract  # after answer_delivery: it reads the answers
from scripted_runtime.scheduler_side.explore import phases
from scripted_runtime.scheduler_side.explore.prompts import prompt_ids  # noqa: F401 - programs call explore.prompt_ids

# Iterations the end-state check allows for every request to finish (and then
# for the engine to go idle), per PP microbatch slot.
END_FINISH_STEPS = 400
END_IDLE_STEPS = 60
# Iterations update_weights waits for the requests to finish before it gives up
# (the tokenizer holds a weight update behind every running generate request).
UPDATE_WAIT_STEPS = 60
# Seconds to wait for the tokenizer's answer to a processed weight update.
UPDATE_ANSWER_TIMEOUT_S = 30.0


class UpdateAnswerTimeout(AssertionError):
    """The tokenizer did not answer a weight update the scheduler had processed."""


class EndStateError(AssertionError):
    """A program ended with the engine not back to a clean idle state."""


def _slots(ctx) -> int:
    return max(1, state.mbs_slots(ctx.scheduler))


def tokenizer_paused(ctx, ops=None) -> bool:
    """Whether the tokenizer holds new requests: the last pause/continue the
    program sent (of ``ops``, default all so far) was a pause; the scheduler
    learns of it one iteration later."""
    return control.pause_posted_last(ctx.control_ops if ops is None else ops)


def live(reqs) -> List[Any]:
    return [h for h in reqs if not h.finished]


def well_formed(reqs) -> List[Any]:
    """The requests ``start_req`` sent (not ``fuzz_request``'s raw ones): the
    ones the output oracle, the request contract and answer delivery judge."""
    return [h for h in reqs if not getattr(h, "raw", False)]


def wait_for_phase(ctx, phase: str, *, max_steps: int):
    """``if (yield from wait_for_phase(ctx, "decode", max_steps=24)): ...``:
    step until the scheduler is in ``phase`` (``phases.phases_of`` of the
    state the next iteration starts from, i.e. what an operation posted now
    is processed against), at most ``max_steps`` iterations. True when it
    holds; False when it did not come (the program goes on). ``idle`` also
    waits for the requests the program posted to be taken in: one posted and
    not received yet is held nowhere, and it would join what comes next."""
    if phase not in phases.PHASES and phase not in phases.FEATURE_PHASES:
        raise ValueError(f"unknown phase {phase!r}: one of {', '.join(phases.PHASES + phases.FEATURE_PHASES)}")
    for waited in range(max_steps + 1):
        if (phase in phases.phases_of(ctx.scheduler, tokenizer_paused=tokenizer_paused(ctx))
                and not (phase == "idle" and ctx.requests_arriving)):
            return True
        if waited == max_steps:
            return False
        yield
    return False


def _slot_holding(s: Any, rid: str) -> Optional[int]:
    """The PP micro-batch slot whose batches hold request ``rid`` (its
    running batch, the batch in flight in it, or the prefill batch it ran
    last), or None."""
    slot_lists = ("running_mbs", "mbs", "last_mbs")
    for name, i, _, reqs in state.places(s, pp_slots=slot_lists):
        if name in slot_lists and any(r.rid == rid for r in reqs):
            return i
    return None


def join_batch_of(ctx, reqs, pick: int):
    """``yield from join_batch_of(ctx, reqs, pick)`` before a start: under PP,
    step until the loop is about to run the micro-batch slot that holds live
    request ``pick`` (modulo their number), so the request started next is
    admitted into that slot and merged into its running batch (a batch of
    requests of different ages in one micro-batch; with requests arriving
    at random steps it takes ``pp_loop_size`` turns of luck). At most one
    turn of the loop; nothing at pp=1 (one running batch: any overlap
    merges) or when no slot holds that request."""
    s = ctx.scheduler
    alive = live(well_formed(reqs))
    if not alive or not state.mbs_slots(s):
        return
    rid = alive[pick % len(alive)].rid
    for _ in range(state.mbs_slots(s)):
        slot = _slot_holding(s, rid)
        if slot is None or state.pp_slot(s) == slot:
            return
        yield


def abort_one(ctx, reqs, pick: int):
    """Abort live request ``pick`` (modulo their number); None when none is live."""
    alive = live(well_formed(reqs))
    if not alive:
        return None
    return ctx.abort(alive[pick % len(alive)])


def flush_cache(ctx):
    """``yield from flush_cache(ctx)``: ``ctx.flush_cache()``, after stepping
    until an earlier flush was processed (the tokenizer sends one at a time).
    KV the program took (``exhaust_kv``) is given back first: see
    ``release_before_flush``."""
    for _ in range(4 * _slots(ctx)):
        if not ctx.unprocessed_ops("flush_cache"):
            break
        yield
    release_before_flush(ctx)
    return ctx.flush_cache()


def release_before_flush(ctx) -> int:
    """Give back the KV ``exhaust_kv`` holds before a flush is posted: an
    accepted flush clears SGLang's allocator (``token_to_kv_pool_allocator.
    clear()``), which would put the held slots on its free list while the
    harness still holds them, hand them to requests and free them a second
    time at the next reset. The memory pressure ends with the flush either
    way (a refused flush ends it too: deterministic, whatever the scheduler
    answers). Returns the tokens given back."""
    return ctx.release_exhausted_kv()  # 0, doing nothing, when nothing is held or queued


def raise_if_lost(ctx, reqs) -> None:
    """EndStateError when a request the scheduler took in is held nowhere and
    never finished or aborted (``ReqHandle.status == "lost"``): it will
    never get an answer, and the tokenizer holds a weight update behind it."""
    lost = [h for h in reqs if h.status == "lost"]
    if lost:
        raise EndStateError(f"requests lost: {', '.join(h.rid for h in lost)} held nowhere in the scheduler, "
                            f"yet never finished or aborted; state: {ctx.describe()}")


def update_weights(ctx, reqs, *, flush_cache: bool, max_steps: Optional[int] = None, tensor: bool = False,
                   distributed: bool = False, missing: bool = False):
    """``yield from update_weights(ctx, reqs, flush_cache=...)``: post
    update_weights_from_disk (``tensor=True``: the same checkpoint's tensors
    through update_weights_from_tensor, inside a begin/end weight-update
    session, each processed before the next; ``distributed=True``: broadcast
    by the harness's trainer rank through update_weights_from_distributed in
    such a session, the group joined first where it is not) so that it reaches the scheduler before the next
    iteration. While paused the tokenizer sends it at once; otherwise it waits
    behind every running request, so first step (bounded) until all of them
    finished in the scheduler. The op is processed in the next iteration
    (the one that would prune the finished requests: issue 14062's window).
    Until the tokenizer has answered the update it holds new generate
    requests back, so this then waits for that answer (which needs no further
    iteration) without stepping. Returns the op, or None when the requests
    did not finish in time. Raises EndStateError as soon as a request is
    lost (``raise_if_lost``), and the answer-delivery check's error when an
    ended request's answer does not come: the update would wait behind
    either forever. Weights a release gave up are resumed first (the RL
    order). ``missing=True``: a disk update of a checkpoint path that does
    not exist (SGLang answers failure; the ``update_weights`` contract then
    requires the weights, their label and the pools unchanged)."""
    if "weights" in ctx.released_memory:
        # the RL order: weights memory back before it is loaded (``ctx`` refuses an update into
        # released weights: on a GPU they are unmapped)
        resume = ctx.resume_memory_occupation(["weights"])
        yield from resume.wait(max_steps=2 * _slots(ctx))
    if flush_cache:
        release_before_flush(ctx)  # the update's flush clears the allocator as flush_cache does
    # A lost request would hold the update in the tokenizer until a wall-clock timeout: say
    # so now, deterministically, as the end-state check would.
    raise_if_lost(ctx, reqs)
    if not tokenizer_paused(ctx):
        budget = (max_steps or UPDATE_WAIT_STEPS) * _slots(ctx)
        for _ in range(budget):
            if not live(reqs):
                break
            yield
            raise_if_lost(ctx, reqs)
        if live(reqs):
            return None
        if ctx.check_enabled(answer_delivery.NAME):
            # The tokenizer holds the update until every generate request it sent is answered:
            # an ended request whose answer never comes would hold it until a wall-clock
            # ArrivalTimeout. Judge the answers now (a clock wait, no step), as the end check would.
            answer_delivery.check_answers(well_formed(reqs), timeout_s=answer_delivery.ANSWER_TIMEOUT_S,
                                          when="the weight update, which the tokenizer holds behind it")
    if tensor and sglang_compat.cpu_tensor_update_supported(ctx.scheduler):
        tensor = False  # CPU tensors under PP: one rank only could rebuild them (measured); the disk path instead
    if distributed and sglang_compat.distributed_update_supported(ctx.scheduler):
        distributed = False  # under PP every stage claims the same rank of the group; the disk path instead
    # labelled, as RL trainers label each update (the weight-version contract then judges every answer's
    # spans across it); unique in the program, apart from update_weight_version's "explored-N"
    version = f"update-{len(ctx.control_ops) + 1}"
    if missing:
        tensor = distributed = False
        path, load_format = MISSING_CHECKPOINT, None
    else:  # the update checkpoint, or the served weights back once it is loaded: every update changes them
        path, load_format = output_oracle.update_source(ctx)
    if not tensor and not distributed:
        op = ctx.update_weights_from_disk(model_path=path, flush_cache=flush_cache, load_format=load_format,
                                          await_arrival=True, weight_version=version)
        yield from _answered(ctx, op)
        return op
    if distributed and DISTRIBUTED_GROUP not in ctx.weight_update_groups:
        join = ctx.init_weights_update_group(DISTRIBUTED_GROUP)
        yield from _answered(ctx, join)
    begin = ctx.begin_weight_update(await_arrival=True)
    yield from _answered(ctx, begin)
    op = (ctx.update_weights_from_distributed(DISTRIBUTED_GROUP, model_path=path, flush_cache=flush_cache,
                                              await_arrival=True, weight_version=version)
          if distributed else ctx.update_weights_from_tensor(model_path=path, flush_cache=flush_cache,
                                                             await_arrival=True, weight_version=version))
    yield from _answered(ctx, op)
    yield from _answered(ctx, ctx.end_weight_update(await_arrival=True))
    return op


# The weight-update group a distributed update of the explorer's and the scenarios' goes over.
DISTRIBUTED_GROUP = "harness_trainer"
# What a ``missing=True`` update loads: a path no checkpoint is at (a directory never created).
MISSING_CHECKPOINT = "/nonexistent/scripted-runtime/no-checkpoint-here"


def _answered(ctx, op):
    """Step until ``op`` was processed, then wait (bounded, no step) for the
    tokenizer's answer, which it sends before it takes the next request."""
    yield from op.wait(max_steps=2 * _slots(ctx))
    if not op.http.wait(UPDATE_ANSWER_TIMEOUT_S):
        raise UpdateAnswerTimeout(f"{op.name} was processed at step {op.processed_step} but the "
                                  f"tokenizer did not answer within {UPDATE_ANSWER_TIMEOUT_S:.0f}s; "
                                  f"state: {ctx.describe()}")


# --- the RL weight-sync cycle (issue 35): release/resume_memory_occupation -----------------
# Iterations a pause(abort) waits for the requests it aborts to end, per PP slot.
ABORT_PAUSE_STEPS = 60
# Seconds to wait for pause(abort)'s HTTP answer once its requests ended: SGLang's tokenizer
# re-checks its lock once a second, woken by the lock's release in the harness's servers
# (hooks/pause_abort_wake.py): the answer then comes within milliseconds; without the wake
# (SCRIPTED_RUNTIME_PAUSE_WAKE=0) 3 s still covers two of SGLang's rounds. Only the known bug
# abort_pause_during_in_place_pause waits it out (5 s until the wake).
ABORT_PAUSE_ANSWER_S = 3.0


# How long to look for the abort_all SGLang's tokenizer sends right before answering a
# pause(abort) whose first round found a request in flight: sent before the answer, over IPC
# (well under a millisecond on a quiet box; its delivery still races the HTTP answer, through
# another socket and process, so up to a second is given, returning as soon as the frame is
# there, where the inbox's grace for a frame after an answer is 0.1 s). A request whose answer
# had not reached the harness when the pause was posted may have left the lock already, and
# then no second round comes (the wait runs out).
LAST_ABORT_GRACE_S = 1.0

# How long pause(abort) first waits, without a step, for the HTTP answers of requests the scheduler
# already ended (sent in the iteration that ended them: they land within milliseconds). Such a
# request still holds SGLang's tokenizer lock until its answer is handled, so whether the pause's
# first round found it there was a race with the clock: the same program then stepped once more,
# or not, before what followed (measured: bench/history_determinism.py, a corpus program of the RL
# cycle on pp1-normal). A longer wait is the answer-delivery contract's to judge, at the end.
ENDED_ANSWER_WAIT_S = 1.0


class PauseAnswerTimeout(AssertionError):
    """pause_generation(abort) was not answered after every request ended."""


def can_start(ctx) -> bool:
    """Whether a request may be sent now: the tokenizer does not hold new
    requests (no pause posted last), and no KV or weights memory is released
    (a forward over it faults on a GPU; ``ctx`` refuses)."""
    if tokenizer_paused(ctx):
        return False
    return not any(t in ("kv_cache", "weights") for t in ctx.released_memory)


def pause(ctx, reqs, mode: str):
    """``yield from pause(ctx, reqs, mode)``: ``ctx.pause_generation(mode)``.
    For ``abort`` (which SGLang's tokenizer turns into aborts) step until
    every request of the program ended, then wait (no step) for its answer,
    which comes once they did: nothing of it is left in flight for later
    steps. Before posting an ``abort`` pause it waits (no step, at most
    ``ENDED_ANSWER_WAIT_S``) for the answers of the requests the scheduler
    already ended. Returns the op.

    SGLang's tokenizer aborts every request once per round and answers in
    the round that finds no request holding its lock; when a request was in
    flight at the first round, the answering round's ``abort_all`` is sent
    right before the answer and reaches the scheduler after the program
    stopped stepping: it is received and processed here (one iteration), or
    the next operation would find it queued ahead (a release refused:
    measured in a kill-table run, two files that did not replay)."""
    if mode == "abort":
        deadline = time.monotonic() + ENDED_ANSWER_WAIT_S
        for h in reqs:
            if h.status in ("finished", "aborted") and not h.http.done:
                h.http.wait(max(0.0, deadline - time.monotonic()))
    # requests the tokenizer forwarded and has not answered hold its lock: its first round finds it held
    # (one it keeps back while paused, "posted" and not arrived, holds none; one started in this step,
    # "posted" too, reached the scheduler's socket and holds it)
    in_flight = [h for h in reqs if not h.http.done and (h.status != "posted" or h.arrived)]
    op = ctx.pause_generation(mode)
    if mode != "abort":
        return op
    for _ in range(ABORT_PAUSE_STEPS * _slots(ctx)):
        if not live(reqs):
            break
        yield
    if not op.http.wait(ABORT_PAUSE_ANSWER_S):
        raise PauseAnswerTimeout(f"pause_generation(abort) got no HTTP answer within {ABORT_PAUSE_ANSWER_S:.0f}s "
                                 f"(live requests: {', '.join(h.rid for h in live(reqs)) or 'none'}); "
                                 f"state: {ctx.describe()}")
    if in_flight and ctx.await_frame("AbortReq", LAST_ABORT_GRACE_S):
        yield
    return op


# What a release waits for first: the program's own pauses and continues not settled yet
# (``ControlOp.settled``: processed, or for an abort pause, which never reaches the scheduler,
# answered). An RL client sends the release after the pause's answer (each an awaited HTTP call),
# and a pause still ahead of it changes what SGLang's idle assert sees
# (``ctx.memory_release_allowed`` refuses while one is queued): without the wait, a release right
# behind its pause was always skipped (the RL cycle with no gap never released, and at pp=4, where
# a pause takes a few iterations to be processed, neither did one a few steps behind it). The
# tokenizer answers a retract pause as soon as it has sent it on, so its answer alone settled
# nothing: a release that took it for done was skipped whenever the answer beat this check.
RELEASE_AFTER_TYPES = ("PauseGenerationReqInput", "ContinueGenerationReqInput")


def release_memory(ctx, tags: str):
    """``yield from release_memory(ctx, tags)``: release ``tags`` (``"all"``
    or one tag) and step until it was processed, when SGLang's precondition
    holds and none of them is released already; else nothing (None). It
    first steps (bounded) until the program's pauses and continues were
    settled (``RELEASE_AFTER_TYPES``). KV taken with ``exhaust_kv`` is
    given back first (``ctx`` does)."""
    names = None if tags == "all" else [tags]
    wanted = sglang_compat.MEMORY_TAGS if names is None else tuple(names)
    if any(t in ctx.released_memory for t in wanted):
        return None
    for request_type in RELEASE_AFTER_TYPES:
        yield from _after_earlier(ctx, request_type)
    if not ctx.memory_release_allowed:
        return None
    op = ctx.release_memory_occupation(names)
    yield from op.wait(max_steps=2 * _slots(ctx))
    return op


def resume_memory(ctx, reqs, *, tensor: bool = False, distributed: bool = False):
    """``yield from resume_memory(ctx, reqs)``: resume everything released,
    in the RL order: weights first, then a weight update (a release lost
    them: the harness's emulation, a GPU's memory saver; ``tensor``: from
    tensors), then the rest; each stepped until processed. Nothing when
    nothing is released."""
    released = ctx.released_memory
    if not released:
        return None
    if "weights" in released:
        op = ctx.resume_memory_occupation(["weights"])
        yield from op.wait(max_steps=2 * _slots(ctx))
        yield from update_weights(ctx, reqs, flush_cache=True, tensor=tensor, distributed=distributed)
    if ctx.released_memory:
        op = ctx.resume_memory_occupation()
        yield from op.wait(max_steps=2 * _slots(ctx))
    return True


def continue_generation(ctx, reqs):
    """``yield from continue_generation(ctx, reqs)``: resume released memory
    (``resume_memory``), then ``ctx.continue_generation()``."""
    yield from resume_memory(ctx, reqs)
    return ctx.continue_generation()


def rl_cycle(ctx, reqs, *, pause_mode: str, tags: str, gap: int, tensor: bool = False,
             distributed: bool = False):
    """``yield from rl_cycle(ctx, reqs, ...)``: an RL framework's weight
    sync, each step processed before the next: pause (``pause_mode``),
    ``gap`` iterations, release ``tags`` where SGLang allows it (an
    ``in_place`` pause with a batch still running does not: the cycle then
    updates without releasing), resume and update (``resume_memory``; the
    update alone when the weights stayed; ``tensor``: the update from
    tensors, in a begin/end session; ``distributed``: broadcast by the
    harness's trainer rank, in such a session), ``gap`` iterations, continue."""
    yield from pause(ctx, reqs, pause_mode)
    yield from ctx.steps(gap)
    released = yield from release_memory(ctx, tags)
    if released is None or "weights" not in ctx.released_memory:
        yield from update_weights(ctx, reqs, flush_cache=True, tensor=tensor, distributed=distributed)
    yield from resume_memory(ctx, reqs, tensor=tensor, distributed=distributed)
    yield from ctx.steps(gap)
    return ctx.continue_generation()


# The request type of each runtime op a helper posts (SGLang's tokenizer sends one of a type at a time).
_RUNTIME_TYPES = {"set_internal_state": "SetInternalStateReq", "slow_down": "SlowDownReqInput",
                  "check_weights": "CheckWeightsReqInput", "get_weights_by_name": "GetWeightsByNameReqInput",
                  "update_weight_version": "UpdateWeightVersionReqInput", "server_info": "GetInternalStateReq",
                  "configure_logging": "ConfigureLoggingReq", "profile": "ProfileReq"}


def _after_earlier(ctx, request_type: str):
    """Step (bounded) until no op of ``request_type`` waits to be processed."""
    for _ in range(4 * _slots(ctx)):
        if not ctx.unsettled_ops_of_type(request_type):
            return
        yield


def slow_down(ctx, seconds: float):
    """``yield from slow_down(ctx, s)``: ``ctx.slow_down(s)`` once an earlier one was processed."""
    yield from _after_earlier(ctx, _RUNTIME_TYPES["slow_down"])
    return ctx.slow_down(seconds)


def set_micro_batch_limit(ctx, value: str):
    """``yield from set_micro_batch_limit(ctx, value)``:
    ``set_internal_state(pp_max_micro_batch_size=...)`` for a ``SetLimit``
    value: ``"1"``, ``"2"``, ``"default"`` (the top of SGLang's range,
    ``max_running_requests // pp_size``: the value it starts with when the
    server is not given one), ``"zero"`` and ``"above"`` (the top + 1),
    which SGLang must refuse."""
    lo, hi = ctx.micro_batch_limit_range
    limit = {"1": 1, "2": 2, "default": hi, "zero": lo - 1, "above": hi + 1}[value]
    yield from _after_earlier(ctx, _RUNTIME_TYPES["set_internal_state"])
    return ctx.set_internal_state(pp_max_micro_batch_size=limit)


def weight_query(ctx, kind: str):
    """``yield from weight_query(ctx, kind)``: one weight or state query
    (``WeightQuery``), once an earlier one of its type was processed; None when the weights are
    released (reading them would fault on a GPU). The diagnostics ride along: ``log_level``
    (``configure_logging``), ``profile`` (a CPU profile of ``PROFILE_STEPS`` forwards) and
    ``profile_stop``. ``compare`` compares
    against a snapshot this program took, on a device where SGLang's
    comparator runs (CUDA); otherwise it is a ``checksum``."""
    if kind == "compare":
        took = any(op.name == "check_weights(snapshot)" and op.success for op in ctx.control_ops)
        cuda = sglang_compat.model_device_type(ctx.scheduler) == "cuda"
        kind = "compare" if took and cuda else "checksum"
    if kind == "freeze_gc":  # sent without waiting for an answer: never queued behind another
        return ctx.freeze_gc()
    if kind == "log_level":  # the other of two levels each time (the reset puts the server's back)
        yield from _after_earlier(ctx, _RUNTIME_TYPES["configure_logging"])
        return ctx.configure_logging("INFO" if ctx.log_level != "INFO" else "WARNING")
    if kind in ("profile", "profile_stop"):  # a profile of two forwards, stopping itself; or a stop
        yield from _after_earlier(ctx, _RUNTIME_TYPES["profile"])
        return ctx.start_profile(num_steps=PROFILE_STEPS) if kind == "profile" else ctx.stop_profile()
    op_name = {"checksum": "check_weights", "snapshot": "check_weights", "compare": "check_weights",
               "get_weights": "get_weights_by_name", "version": "update_weight_version",
               "server_info": "server_info"}.get(kind)
    if op_name is None:
        raise ValueError(f"unknown weight query {kind!r}")
    yield from _after_earlier(ctx, _RUNTIME_TYPES[op_name])
    if "weights" in ctx.released_memory and kind in ("checksum", "snapshot", "compare", "get_weights"):
        return None
    if op_name == "check_weights":
        return ctx.check_weights(kind)
    if kind == "get_weights":
        return ctx.get_weights_by_name(WEIGHT_QUERY_PARAMETER, 2)
    if kind == "version":
        n = sum(1 for op in ctx.control_ops if op.name.startswith("update_weight_version("))
        return ctx.update_weight_version(f"explored-{n + 1}")
    return ctx.server_info()


def session_op(ctx, kind: str):
    """``yield from session_op(ctx, kind)`` (``SessionOp``): ``open`` a new
    session (ids ``explored-session-<n>``, the same on every replay),
    ``reopen`` the program's last one (SGLang must refuse an id that is
    open), ``close`` the program's last one still open (an unknown id when
    none is: SGLang only warns). An open waits for an earlier open's answer
    (the tokenizer refuses an id it is still opening without asking)."""
    opened = [op.payload["session_id"] for op in ctx.control_ops if op.name.startswith("open_session(")]
    if kind == "open" or (kind == "reopen" and not opened):
        yield from _after_earlier(ctx, "OpenSessionReqInput")
        return ctx.open_session(f"explored-session-{len(opened) + 1}")
    if kind == "reopen":
        yield from _after_earlier(ctx, "OpenSessionReqInput")
        return ctx.open_session(opened[-1])
    if kind == "close":
        still = [sid for sid in opened if sid in ctx.open_sessions]
        return ctx.close_session(still[-1] if still else "explored-session-unknown")
    raise ValueError(f"unknown session operation {kind!r}")


# The longest history a session turn is sent with (tokens): the prompt of the turn it continues,
# that turn's max_new_tokens and the new input, so a chain of turns stays inside every topology's
# KV pool (pp1-hicache's is 400 tokens) and the oracle's reference runs stay short.
TURN_MAX_HISTORY = 320
# Iterations (per PP slot) a turn waits for the turn it continues to end before it is sent anyway.
TURN_WAIT_STEPS = 40


def session_of(handle) -> Optional[str]:
    """The session a request was sent as a turn of (``ctx.start_req(session=...)``), or None."""
    return getattr(handle, "session", None)


def session_turn(ctx, reqs, *, after: Optional[int], family: int, length: int, max_new_tokens: int,
                 stream: bool = False, eager: bool = False):
    """``yield from session_turn(ctx, reqs, ...)`` (``Turn``): with ``after``
    None (or no turn yet), open a session (``explored-session-<n>``, the
    numbering ``session_op`` uses) and send a conversation's first turn,
    ``prompt_ids(family, length)``; else continue the program's turn
    ``after`` (modulo their number) in its session with that input, once
    that turn has ended, as a chat client sends its next turn after the
    answer (at most ``TURN_WAIT_STEPS`` iterations per PP slot, then
    anyway), or at once with ``eager``; its session may be closed by then
    (SGLang aborts a turn after one still running, or in a closed
    session). The turn is appended to ``reqs``
    (every end check judges it; the output oracle against the history,
    ``handle.expected_prompt``, when the turn it continues had finished).
    Not sent (returns None) when the open is refused or the history could
    pass ``TURN_MAX_HISTORY`` tokens."""
    turns = [h for h in reqs if session_of(h) is not None]
    earlier = turns[after % len(turns)] if after is not None and turns else None
    if earlier is None:
        op = yield from session_op(ctx, "open")
        yield from op.wait()
        if not op.success:
            return None
        session = op.payload["session_id"]
    else:
        session = session_of(earlier)
        for _ in range(0 if eager else TURN_WAIT_STEPS * _slots(ctx)):
            if earlier.finished:
                break
            yield
        before = earlier.expected_prompt or list(getattr(earlier.last_req, "origin_input_ids", ()) or ())
        if len(before) + (earlier.max_new_tokens or 0) + length > TURN_MAX_HISTORY:
            return None
    handle = ctx.start_req(input_ids=prompt_ids(family, length), max_new_tokens=max_new_tokens, ignore_eos=True,
                           temperature=0.0, stream=stream, session=session, after=earlier)
    reqs.append(handle)
    return handle


# Iterations a LoRA helper waits for the program's earlier LoRA update (an unload waits at the
# tokenizer until the adapter's requests finished) before it gives up on its own.
LORA_WAIT_STEPS = 120
LORA_ANSWER_WAIT_S = 5.0  # for the HTTP answers of an adapter's finished requests, before its unload


def ensure_lora(ctx, name: str):
    """``yield from ensure_lora(ctx, name)``: whether a request may name
    LoRA adapter ``name`` now (``ctx.lora_held``: the program's earlier LoRA
    updates settled, then loaded unless the scheduler holds it). False (the
    request is not sent) when the earlier update does not settle within
    ``LORA_WAIT_STEPS`` or the load is refused: SGLang's tokenizer would
    otherwise hold the request and load the adapter itself, a load the
    frozen scheduler cannot answer."""
    return (yield from ctx.lora_held(name, max_steps=LORA_WAIT_STEPS))


def lora_op(ctx, kind: str, name: str):
    """``yield from lora_op(ctx, kind, name)`` (``LoraOp``): ``load``,
    ``load_tensors`` (from its tensors: ``load_lora_adapter_from_tensors``) or
    ``unload`` adapter ``name`` after the program's earlier LoRA update
    settled (skipped when it does not within ``LORA_WAIT_STEPS``). A load is
    awaited (processed). An unload is posted once no unfinished request
    uses the adapter (stepping until then, bounded), and its arrival is
    waited for by the clock: SGLang's tokenizer would hold it until then
    anyway, and posted earlier it would reach the scheduler at an iteration
    that depends on the tokenizer's timing, so a replay would differ (the
    unload of an adapter in use, held by the tokenizer, is
    ``scenarios/lora.py:load_serve_unload``)."""
    from scripted_runtime.scheduler_side.context.lora_ops import UNLOAD_ARRIVAL_TIMEOUT_S

    if not (yield from ctx.settle_lora_ops(LORA_WAIT_STEPS)):
        return None
    if kind in ("load", "load_tensors"):
        op = ctx.load_lora_adapter(name) if kind == "load" else ctx.load_lora_adapter_from_tensors(name)
        yield from op.wait()
        return op
    if kind == "unload":
        for _ in range(LORA_WAIT_STEPS):
            if not ctx.lora_in_use(name):
                break
            yield
        else:
            return None
        # the users' answers follow by the clock (one the tokenizer holds, a paused one, never: skipped)
        deadline = time.monotonic() + LORA_ANSWER_WAIT_S
        if not all(h.http.wait(max(0.0, deadline - time.monotonic())) for h in ctx.lora_requests_unanswered(name)):
            return None
        op = ctx.unload_lora_adapter(name)
        ctx.await_arrival(op, UNLOAD_ARRIVAL_TIMEOUT_S)
        return op
    raise ValueError(f"unknown LoRA operation {kind!r}")


# The forwards a drawn profile (``WeightQuery("profile")``) records before it stops itself.
PROFILE_STEPS = 2

# A parameter that every Llama/Qwen2-shaped checkpoint holds under its own name (not a stacked one).
WEIGHT_QUERY_PARAMETER = "model.layers.0.mlp.down_proj.weight"


def _step_until_idle(ctx, budget: int):
    """Step (at most ``budget`` iterations) until the scheduler's idle gate
    and the harness's scan agree the engine is idle, and (under PP) every
    KV operation queued for the ranks was applied (the end-state checks'
    give-back), and every control operation that reached the scheduler's
    socket was processed (one posted last would otherwise be processed in
    the next script's reset, its contract unchecked); True when it is."""
    def settled() -> bool:
        return (ctx.is_fully_idle and ctx.nothing_held and not ctx.kv_pressure_pending
                and not any(op.arrived and not op.processed for op in ctx.control_ops))

    for _ in range(budget):
        if settled():
            return True
        yield
    return settled()


def end_state_checks(ctx, reqs) -> Dict[str, Any]:
    """``yield from end_state_checks(ctx, reqs)``: resume a pause left open,
    then require every request to finish or abort, the engine to go idle
    (the scheduler's gate and the harness's scan agree), the pools to be
    whole (every row free, KV all free or evictable, no tree lock held), and
    every greedy request's tokens to be its reference's (the output oracle,
    ``scheduler_side/output_oracle.py``; off with the check name
    ``greedy_output``), and every ended request's answer to agree with its
    own sampling parameters (``scheduler_side/request_contract.py``; off with
    ``request_semantics``), and every ended request's HTTP answer to arrive
    holding what the scheduler emitted (``scheduler_side/answer_delivery.py``;
    off with ``answer_delivery``). HiCache copies the program held and KV it took
    (``exhaust_kv``) are given back first: a request waiting for memory the
    program holds could never finish."""
    yield from resume_memory(ctx, reqs)  # nothing released: does nothing
    if tokenizer_paused(ctx):
        ctx.continue_generation()
    ctx.release_exhausted_kv()  # nothing held or queued: does nothing
    if hicache_state.controller(ctx.scheduler) is not None:
        # held copies are the program's own window; the end needs them done
        # (a held load also keeps later loads of a full ack ring waiting)
        ctx.release_hicache_transfers()
    raise_if_lost(ctx, reqs)
    slots = _slots(ctx)
    budget = END_FINISH_STEPS * slots
    for _ in range(budget):
        if not live(reqs):
            break
        yield
    stuck = live(reqs)
    if stuck:
        raise EndStateError(
            f"requests never finished: {len(stuck)} of {len(reqs)} still live after {budget} iterations "
            f"([{', '.join(h.rid + ':' + h.status for h in stuck)}]); state: {ctx.describe()}")
    budget = END_IDLE_STEPS * slots
    if not (yield from _step_until_idle(ctx, budget)):
        raise EndStateError(f"engine not idle: every request finished but after {budget} iterations "
                            f"is_fully_idle={ctx.is_fully_idle} nothing_held={ctx.nothing_held}; "
                            f"state: {ctx.describe()}")
    stats = ctx.engine_stats()
    held_by_script = ctx.exhausted_kv_tokens
    problems = []
    if stats["req_pool_free"] != stats["req_pool_total"]:
        problems.append(f"req_to_token rows free {stats['req_pool_free']}/{stats['req_pool_total']}")
    if stats["kv_pool_free"] + stats["evictable"] + held_by_script != stats["kv_pool_total"]:
        problems.append(f"KV free {stats['kv_pool_free']} + evictable {stats['evictable']} != "
                        f"total {stats['kv_pool_total']}")
    if stats["protected"]:
        problems.append(f"{stats['protected']} tree tokens still protected (locked)")
    if problems:
        raise EndStateError("pools not whole at idle: " + "; ".join(problems))
    fuzzed = [h for h in reqs if getattr(h, "raw", False)]
    if fuzzed and ctx.check_enabled(request_fuzz.NAME):
        yield from survival_checks(ctx, fuzzed)
    plain = well_formed(reqs)
    compared = 0
    if ctx.check_enabled("greedy_output"):
        compared = yield from output_oracle.check_outputs(ctx, plain)
    answers = 0
    if ctx.check_enabled(request_contract.NAME):  # last: the checks above keep their findings' names
        answers = request_contract.check_answers(plain)
    logprobs = 0
    if ctx.check_enabled(logprob_contract.NAME):  # after both: a wrong token is theirs to name
        logprobs = logprob_contract.check_logprobs(plain)
    delivered = 0
    if ctx.check_enabled(answer_delivery.NAME):  # waits on the clock, takes no step
        delivered = answer_delivery.check_answers(plain)
    versions = 0
    if ctx.check_enabled(weight_version_contract.NAME):  # after the answers' delivery: it reads them
        versions = weight_version_contract.check_answers(plain, current_version=ctx.weight_version)
    return {
        "outputs_compared": compared,
        "answers_checked": answers,
        "logprobs_checked": logprobs,
        "answers_delivered": delivered,
        "weight_versions_checked": versions,
        "requests": len(reqs),
        "fuzzed": len(fuzzed),
        "finished": sum(1 for h in reqs if h.status == "finished"),
        "aborted": sum(1 for h in reqs if h.status == "aborted"),
        "tree_tokens": stats["tree_tokens"],
        "slot": state.pp_slot(ctx.scheduler),
    }


# --- request fuzzing (issue 38) -------------------------------------------------------------
# Iterations the survival check gives the probe request (a well-formed one sent after the
# fuzzed requests ended) to finish, per PP microbatch slot.
PROBE_STEPS = 200
PROBE_NEW_TOKENS = 2


def fuzz_request(ctx, reqs, cases: Sequence[str], *, family: int = 0, prompt_len: int = 8,
                 max_new_tokens: int = 4):
    """Send a fuzzed ``/generate`` request: the base request (a prompt of
    ``family``, ``max_new_tokens``, ``request_fuzz.BASE_SAMPLING``) with the
    field ``cases`` applied (``request_fuzz.CASES``), as it is
    (``ctx.send_generate``), and add its handle to ``reqs``. ``rid_reused``
    takes the rid of an ended request (``_rid_to_reuse``). The end-state checks
    judge it by the survival contract (``survival_checks``). Counted in the
    coverage table as ``fuzz:request`` in the phases it was sent in, and in
    the request-fields table per case. Returns the handle."""
    limits = request_fuzz.resolve_limits(ctx.scheduler)
    earlier = _rid_to_reuse(reqs) if "rid_reused" in cases else None
    # No rid of its own: ctx.send_generate gives it one of the run's usual form, which the
    # determinism check reads as "a rid" (a rid of its own differed between two runs of a program).
    payload = request_fuzz.build_payload(cases, prompt=prompt_ids(family, prompt_len), max_new_tokens=max_new_tokens,
                                         rid=None, limits=limits, reused_rid=earlier)
    if coverage_sink is not None:
        coverage_sink("fuzz:request")
        for case in cases:
            coverage_sink(f"fuzzcase:{case}")
    handle = ctx.send_generate(payload)
    handle.fuzz_cases = tuple(cases)
    reqs.append(handle)
    return handle


def _rid_to_reuse(reqs) -> Optional[str]:
    """The rid ``rid_reused`` sends again: the last request that ended (in
    the scheduler, or refused before it) and that the scheduler holds
    nowhere, once its answer arrived (waited for on the clock, no step: the
    tokenizer forgets a rid when it answers, so SGLang then takes the rid
    again, every run alike). None when there is none: a live rid is refused
    as a duplicate, and one the scheduler still holds (finished, not yet
    pruned) would be two requests of one rid at once, which the harness's
    rid-keyed bookkeeping cannot tell apart."""
    ended = [h for h in reqs if h.finished and not h.holders]
    if not ended:
        return None
    ended[-1].http.wait(answer_delivery.ANSWER_TIMEOUT_S)
    return ended[-1].rid


def abort_unknown(ctx):
    """``/abort_request`` for a rid no request ever had: SGLang must answer
    and change nothing. Counted in the coverage table as ``fuzz:abort_unknown``."""
    if coverage_sink is not None:
        coverage_sink("fuzz:abort_unknown")
    return ctx.abort(f"never-sent-{ctx.step}")


def survival_checks(ctx, fuzzed):
    """The survival contract's end (``request_fuzz``): every fuzzed request
    got a clean answer of the kind its values call for (waited on the clock,
    no step), then, the engine being whole (checked just before), the next
    well-formed request is served: a probe request must finish within
    ``PROBE_STEPS`` iterations with an answer."""
    deadline = time.monotonic() + answer_delivery.ANSWER_TIMEOUT_S
    for h in fuzzed:
        h.http.wait(max(0.0, deadline - time.monotonic()))
        later = [op.name for op in ctx.control_ops if op.posted_step >= h.posted_step]
        problem = request_fuzz.judge(h.fuzz_cases, h.http.status, h.http.body,
                                     h.http.error if h.http.done else "no answer within "
                                     f"{answer_delivery.ANSWER_TIMEOUT_S:.0f}s of the program's end",
                                     aborted_by_program=request_fuzz.aborted_by_program(later))
        if problem:
            raise request_fuzz.SurvivalError(f"{problem} (rid {h.rid}, {h.status} in the scheduler)")
    probe = ctx.start_req(input_ids=prompt_ids(0, 8), max_new_tokens=PROBE_NEW_TOKENS, ignore_eos=True,
                          temperature=0.0)
    budget = PROBE_STEPS * _slots(ctx)
    for _ in range(budget):
        if probe.finished:
            break
        yield
    answered = probe.http.wait(answer_delivery.ANSWER_TIMEOUT_S) if probe.finished else False
    if probe.status != "finished" or not answered or probe.http.status != 200:
        raise request_fuzz.SurvivalError(
            f"the well-formed request sent after the fuzzed ones was not served: {probe.status} after "
            f"{budget} iterations, answer {probe.http.as_dict() if probe.http.done else 'none'}; "
            f"state: {ctx.describe()}")
    yield from _step_until_idle(ctx, END_IDLE_STEPS * _slots(ctx))


# An explored hold ends by itself: a slow GPU copy still finishes, and a
# program that waits for idle (a flush, a weight update) must see it end.
HOLD_ITERATIONS = 16


def hold_transfers(ctx, *, loads: bool, backups: bool) -> None:
    """Hold HiCache's loads and/or backups (``ctx.hold_hicache_transfers``)
    for at most ``HOLD_ITERATIONS`` each; counted in the coverage table as
    ``hicache:hold``."""
    if coverage_sink is not None:
        coverage_sink("hicache:hold")
    ctx.hold_hicache_transfers(loads=loads, backups=backups, max_iterations=HOLD_ITERATIONS)


def release_transfers(ctx) -> int:
    """Release what the HiCache gate holds; counted as ``hicache:release``."""
    if coverage_sink is not None:
        coverage_sink("hicache:release")
    return ctx.release_hicache_transfers()


# Operations that flush the cache when the scheduler processes them (a weight update may).
FLUSHING_OPS = ("flush_cache", "update_weights_from_disk")


# What exhaust_kv leaves to SGLang beyond its drawn pages: room for the largest request SGLang
# admitted (its prompt and max_new_tokens; a waiting one is not admitted yet), counting the KV SGLang already holds (its requests' and
# the tree's: a retraction or an eviction gives it back). SGLang assumes what it admitted can
# finish: it admits a chunked prompt for all of its chunks and a request for all of its new
# tokens, and when decoding runs short it retracts until one request is left, which must then
# fit (0.5.23 crashes with "Out of memory" otherwise). Slots taken by the harness are slots no
# request of SGLang's holds, so taking every one strands an admitted request where no deployment
# could (met by the first 2,000-program runs: a scheduler crash and a lost chunked request, both
# at 0 pages left and nothing held). A request admitted later is SGLang's own admission's to
# judge: it admits one only if its prompt and all of its new tokens fit.
# Grammar 2 left a fixed 256 tokens free on top of what SGLang held, so decoding requests of at
# most 12 new tokens never ran short; grammar 3 leaves only what the largest one needs, so
# ``retract_decode`` runs (the ``decode_retracted_waiting`` window).


def room_sglang_reserved(ctx) -> int:
    """Free KV tokens the requests SGLang admitted may still need, which
    ``exhaust_kv`` leaves free (the pressure SGLang is built to survive):

    * every prompt token an admitted request has still to extend (the
      chunked request's later chunks): admission counted the whole prompt
      when it admitted the request, and a prefill in progress cannot be
      retracted (``get_new_batch_prefill`` continues a chunked request with
      a full chunk when its budget is spent, and ``alloc_for_extend`` then
      fails: "Out of memory");
    * plus the most new tokens any one admitted request may still decode:
      under pressure ``retract_decode`` frees the other decoding requests'
      KV, but the last one must fit.

    A waiting request, a retracted one included, is SGLang's admission's to
    judge: it waits until its prompt and new tokens fit. 0 with no admitted
    request."""
    waiting = {id(r) for r in getattr(ctx.scheduler, "waiting_queue", ()) or ()}
    prefill = decode = 0
    for r in ctx.list_active_reqs():
        if id(r) in waiting:
            continue
        prompt = len(getattr(r, "origin_input_ids", ()) or ())
        prefill += max(0, prompt - state.kv_allocated_len(r))
        new = int(getattr(r.sampling_params, "max_new_tokens", 0) or 0) - len(getattr(r, "output_ids", ()) or ())
        decode = max(decode, new)
    return prefill + decode


def exhaust_kv(ctx, leave_pages: int, evict_cache: bool = False):
    """``yield from exhaust_kv(ctx, leave_pages)``: ``ctx.exhaust_kv`` as a
    program action: memory pressure from now on, so admission refuses,
    ``retract_decode`` retracts and the radix tree is evicted, until
    ``release_kv`` (or a flush, or the end-state checks) gives it back.
    ``evict_cache=True`` evicts the radix tree's evictable KV first
    (``ctx.evict_cache``) and takes that too: decoding then runs short at
    once instead of eating the cache first.
    First steps (bounded) until no flush the program posted is still
    unprocessed: one processed after the slots were taken would clear the
    allocator under them (``release_before_flush``). Counted in the
    coverage table as ``kv:exhaust``. Returns the tokens taken (0 when
    fewer were free, or a flush stayed unprocessed and nothing was taken).
    It always leaves SGLang the room its admitted requests may still need
    (``room_sglang_reserved``) beyond ``leave_pages``."""
    for _ in range(4 * _slots(ctx)):
        if not any(ctx.unprocessed_ops(name) for name in FLUSHING_OPS):
            break
        yield
    if any(ctx.unprocessed_ops(name) for name in FLUSHING_OPS):
        return 0
    if coverage_sink is not None:
        coverage_sink("kv:exhaust")
    page = max(1, int(getattr(ctx.scheduler, "page_size", 1) or 1))
    if evict_cache:
        ctx.evict_cache()
    return ctx.exhaust_kv(leave_pages=leave_pages + -(-room_sglang_reserved(ctx) // page))


def release_kv(ctx) -> int:
    """Give back what ``exhaust_kv`` took (``ctx.release_exhausted_kv``);
    counted as ``kv:release``."""
    if coverage_sink is not None:
        coverage_sink("kv:release")
    return ctx.release_exhausted_kv()


# The stop token a request gets when no reference says which token its
# output holds (the output oracle off, or a device where it compares
# nothing): an ordinary token of the prompts' range, so the stop fires only
# where the model happens to output it.
FALLBACK_STOP_ID = 3
# ...and the stop string then: text no output of the tiny tokenizer's letters a-h holds
FALLBACK_STOP_TEXT = "<no reference>"


def stop_texts(ctx, wanted: Sequence[Tuple[int, int, int, int]]):
    """``texts = yield from stop_texts(ctx, [(family, length, k, span), ...])``:
    the stop string of each request that stops "on the text of its prompt's
    reference tokens k .. k + span - 1", decoded with the server's tokenizer
    (a topology with one: ``pp1-text``), resolved as ``stop_tokens`` resolves
    stop tokens (``stop_text_of``: span 0 straddles tokens k and k + 1).
    SGLang's window must see a stop whose occurrence spans at most its own
    encoding's length plus one; a longer one it may miss by design
    (``scheduler_side/stop_strings.py``). Without references, or without a
    tokenizer, every stop is ``FALLBACK_STOP_TEXT``."""
    wanted = list(dict.fromkeys(tuple(w) for w in wanted))
    tokenizer = getattr(ctx.scheduler, "tokenizer", None)
    tokens = yield from stop_tokens(ctx, [(f, n, k + max(span, 2) - 1) for f, n, k, span in wanted]) \
        if tokenizer is not None and output_oracle.references_wanted(ctx) else {}
    out: Dict[Tuple[int, int, int, int], str] = {}
    for family, length, k, span in wanted:
        ref = output_oracle.cached_reference(ctx, prompt_ids(family, length)) if tokens else None
        text = ""
        if ref is not None and len(ref[0]) >= k + max(span, 2):
            text = stop_text_of(stop_strings.codec(tokenizer)[0], ref[0], k, span)
        out[(family, length, k, span)] = text or FALLBACK_STOP_TEXT
    return out


def stop_text_of(decode, tokens: Sequence[int], k: int, span: int) -> str:
    """The stop string ``Start.stop_span`` names: the text of ``tokens``
    ``k`` .. ``k + span - 1``; for ``span`` 0, the last character of token
    ``k``'s text and the first of token ``k + 1``'s (a string that starts
    inside a token: its occurrence spans two tokens, one more than its own
    encoding where that is one token). Pure."""
    if span == 0:
        first, second = decode(tokens[k:k + 1]), decode(tokens[k + 1:k + 2])
        return first[-1:] + second[:1] if first and second else ""
    return decode(tokens[k:k + span])


def stop_tokens(ctx, wanted: Sequence[Tuple[int, int, int]]):
    """``stops = yield from stop_tokens(ctx, [(family, length, k), ...])``:
    the stop token of each request that stops "on the k-th token of its
    prompt's reference output", by (family, length, k), resolved once at the
    program's start (so a weight update later in the program changes
    nothing). A random stop id would almost never fire on pseudo-random
    outputs; the k-th reference token fires at position k or before (where
    the same id came earlier), so the output oracle's stop cut is exercised.

    With references wanted (``output_oracle.references_wanted``: the oracle
    on, on the CPU default) each is read from the oracle's cache, which the
    explorer fills before any program (no step taken). A prompt not cached
    yet (a written file replayed on a fresh server) is computed here, before
    the program's first action, as the oracle computes any reference (alone
    on the idle engine after a flush); the engine is then flushed and, under
    PP, brought round to slot 0 again, as the reset leaves it. Without
    references every stop is ``FALLBACK_STOP_ID``."""
    wanted = list(dict.fromkeys(tuple(w) for w in wanted))
    if not output_oracle.references_wanted(ctx):
        return {w: FALLBACK_STOP_ID for w in wanted}
    out: Dict[Tuple[int, int, int], int] = {}
    computed = False
    for family, length, k in wanted:
        ids = prompt_ids(family, length)
        ref = output_oracle.cached_reference(ctx, ids)
        if ref is None or len(ref[0]) <= k:
            ref = yield from output_oracle.reference(ctx, tuple(ids), k + 1)
            computed = True
        out[(family, length, k)] = ref[0][k]  # (tokens, comparable prefix): any token is a fine stop id
    if computed:
        yield from _as_after_reset(ctx)
    return out


def _as_after_reset(ctx):
    """Flush (the references left their prompts in the tree) and, under PP,
    step round to slot 0: the state the engine reset leaves a program in."""
    yield from output_oracle.flush_unseen(ctx, "after computing stop tokens' references")
    slots = state.mbs_slots(ctx.scheduler)
    for _ in range(slots or 0):
        if state.pp_slot(ctx.scheduler) in (None, 0):
            break
        yield


# Set by the interpreter for the program it runs: records a coverage-table row and its phases.
coverage_sink: Optional[Any] = None


def extension_action(ctx, reqs, name: str):
    """``yield from explore.extension_action(ctx, reqs, NAME)``: run the
    extension action NAME (``scripted_runtime/extensions.py``), loaded in
    this rank by ``--extension``; counted in the coverage table as
    ``ext:NAME`` in the phases it started in."""
    from scripted_runtime import extensions

    ext = extensions.get_action(name)
    if coverage_sink is not None:
        coverage_sink(f"ext:{name}")
    result = ext.fn(ctx, reqs)
    if inspect.isgenerator(result):
        result = yield from result
    return result
