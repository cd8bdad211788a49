"""The script driver: runs on the driver rank (pp_rank == tp_rank == 0),
inside the scheduler process, on the scheduler's own thread.

``before_iteration()`` is called by the hook at the start of every event-loop
iteration. It advances one generator (``_main``), which

1. lets the scheduler run freely until the server's warmup request has been
   served and the engine is idle again, then reports ``Ready``;
2. blocks between scripts waiting for a command from the harness (the
   scheduler is frozen meanwhile; other ranks wait in the cross-rank
   broadcast);
3. for ``RunScript``: resets the engine, then advances the script's generator
   once per iteration, and reports ``ScriptDone``.
"""
from __future__ import annotations

import inspect
import os
import pickle
import sys
import time
import traceback
from typing import Any, Generator, Optional, Tuple

import zmq

from scripted_runtime.hooks import hicache_gate, sglang_compat
from scripted_runtime import extensions, protocol
from scripted_runtime.scheduler_side import (contracts, control, memory_occupation, reset_fingerprint,
                                             runtime_contracts, runtime_knobs, script_loader, state)
from scripted_runtime.scheduler_side.context.api import MEMORY_OPS, ScriptContext
from scripted_runtime.scheduler_side.control import ControlLedger
from scripted_runtime.scheduler_side.http_poster import HttpPoster
from scripted_runtime.scheduler_side.inbox import ArrivalTimeout, TokenizerInbox
from scripted_runtime.scheduler_side.rank_ops import KvPressure, RankKvOp
from scripted_runtime.scheduler_side.request_tracker import RequestTracker
from scripted_runtime.scheduler_side.run_counters import BatchRecord, RunCounters, admitted_in_pass
from scripted_runtime.scheduler_side.step_observer import StepObserver
from scripted_runtime.scheduler_side import weight_trainer
from scripted_runtime.scheduler_side.weight_trainer import WeightTrainer

WARMUP_TIMEOUT_S = 180.0
RESET_MAX_STEPS = 400
# Seconds the reset gives an unanswered pause_generation(abort) (SGLang's tokenizer re-checks
# its lock once a second) before it calls the tokenizer wedged.
ABORT_PAUSE_GRACE_S = 3.0
LEFTOVER_OP_WAIT_S = 60.0  # for ops the previous script posted and did not wait for
RESTORE_OP_WAIT_S = 15.0  # for the reset's own restoring ops to reach the scheduler (a LoRA unload)
CANCEL_POLL_S = 0.01  # how often a running script looks for the harness's Cancel
ENV_EXPECT_WARMUP = "SCRIPTED_RUNTIME_EXPECT_WARMUP"


class ResetError(RuntimeError):
    """The engine could not be brought back to idle between scripts."""


class Driver:
    """Builds the run's parts and hands each one what it works with, by
    keyword: the counters (step, iteration, batch log, I/O seconds), the
    request tracker, the control ledger, the HTTP poster, the tokenizer
    inbox, the KV the script holds, the step observer (windows and checks)
    and the script's context."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        # priority scheduling on: each prefill's record carries what the priority contract reads
        self.priority_on = sglang_compat.priority_settings(scheduler) is not None
        self._admission_from = 0.0
        # the admission budget contract judges this scheduler's prefill passes (sglang_compat says
        # which budgets it reads); the last pass's (batch id, room, admitted) until its batch launches
        self.admission_judged = sglang_compat.admission_unjudged(scheduler) is None
        self._admission: Optional[Tuple[int, Tuple[int, int, int], Tuple[Tuple[str, int, int], ...]]] = None
        counters = self.counters = RunCounters()
        self._script_gen: Optional[Any] = None  # the running script's generator
        self._reset_flushes_queued = 0  # reset flushes handed in and not dispatched yet
        self._reset_flush_answer: Any = None
        self.tracker = RequestTracker()
        self.ledger = ControlLedger(lambda: counters.step)
        self._resetting = False  # inside _reset (a crash there is the previous script's leftover)
        self._fresh_fingerprint = None  # reset_fingerprint.take after this server's first reset
        self.poster = HttpPoster(os.environ[protocol.ENV_HTTP_URL], api_key=os.environ.get(protocol.ENV_API_KEY))
        self.inbox: TokenizerInbox = sglang_compat.swap_tokenizer_socket(scheduler, TokenizerInbox)
        self.inbox.arrival_listeners.append(self.ledger.on_arrival)
        sglang_compat.wrap_request_dispatcher(scheduler, self._recording_dispatcher)
        self.kv_holds = KvPressure(scheduler, self.inbox, pipelined=sglang_compat.rank_info(scheduler)[2] > 1)
        self.observer = StepObserver(scheduler=scheduler, counters=counters, tracker=self.tracker,
                                     ledger=self.ledger, kv_holds=self.kv_holds)
        self.weight_trainer = WeightTrainer()
        self.ctx = ScriptContext(scheduler=scheduler, counters=counters, ledger=self.ledger, poster=self.poster,
                                 tracker=self.tracker, inbox=self.inbox, kv_holds=self.kv_holds,
                                 observer=self.observer, weight_trainer=self.weight_trainer)
        for entry in reversed(os.environ.get(protocol.ENV_SYS_PATH, "").split(os.pathsep)):
            if entry and entry not in sys.path:
                sys.path.insert(0, entry)
        self._zmq = zmq.Context()
        self._sock = self._zmq.socket(zmq.PAIR)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(os.environ[protocol.ENV_IPC_ADDR])
        self._main_gen = self._main()

    # --- called by the hook -------------------------------------------------
    def before_iteration(self) -> None:
        self.counters.iteration += 1
        hicache_gate.gate().tick(self.counters.iteration)  # held HiCache copies age (hooks/hicache_gate.py)
        next(self._main_gen)

    def after_ingest(self) -> None:
        """The iteration's requests are in (arrivals queued, control requests
        dispatched: a retract pause's requests queued again): a request
        queued from here on was queued by this iteration's admission."""
        self._admission_from = time.perf_counter()

    def before_prefill_pass(self) -> Tuple[Tuple[int, int, int], Any]:
        """At a prefill pass's start: the (free, evictable, page) KV its
        budget starts from, and the chunked request it continues (not charged as
        an admission: SGLang lets a continuation make progress whatever is
        free)."""
        return sglang_compat.admission_room(self.scheduler), getattr(self.scheduler, "chunked_req", None)

    def after_prefill_pass(self, before: Tuple[Tuple[int, int, int], Any], returned: Any) -> None:
        """Keep what the pass admitted for its batch's launch record: each
        request but the continued one, with its extend and the new tokens
        admission charges it (none for a request left chunked: its decode
        is charged when its last chunk is admitted)."""
        room, continued = before
        batch = sglang_compat.prefill_pass_batch(returned)
        if batch is None:
            self._admission = None
            return
        admitted = admitted_in_pass(batch.reqs, getattr(batch, "extend_lens", None), continued,
                                    getattr(self.scheduler, "chunked_req", None))
        self._admission = (id(batch), room, admitted)

    def on_run_batch(self, batch: Any) -> None:
        mode = state.batch_mode(batch)
        chunked = getattr(self.scheduler, "chunked_req", None)
        reqs = batch.reqs
        extend = mode is not None and batch.forward_mode.is_extend()
        if extend:
            self.tracker.on_batch(reqs, getattr(batch, "prefix_lens", None), getattr(batch, "extend_lens", None))
        else:
            self.tracker.on_batch(reqs)
        self.counters.batch_log.append(
            BatchRecord(
                self.counters.step,
                state.pp_slot(self.scheduler),
                mode,
                tuple([r.rid for r in reqs]),
                chunked.rid if chunked is not None else None,
                tuple([state.req_pool_idx(r) for r in reqs]),
                self._in_flight_rows(),
                tuple([id(r) for r in reqs]),
                len(getattr(getattr(self.scheduler, "running_batch", None), "reqs", None) or ()) if extend else -1,
                self._priority_pass(reqs) if extend and self.priority_on else None,
                self._take_admission(batch) if extend else None,
                self._fill_desync(reqs) if extend else (),
            )
        )

    def _fill_desync(self, reqs: Any) -> Tuple[Any, ...]:
        """For the fill_ids contract (when on): the launched extend's requests
        whose fill ids are not their prompt followed by their output."""
        if not self.observer.judges_fill_ids:
            return ()
        desync = [d for d in map(sglang_compat.fill_ids_desync, reqs) if d is not None]
        return tuple(desync)

    def _take_admission(self, batch: Any):
        """The admission the last prefill pass recorded, if it made ``batch``."""
        admission, self._admission = self._admission, None
        if admission is None or admission[0] != id(batch):
            return None
        return admission[1], admission[2]

    def _priority_pass(self, reqs: Any) -> Tuple[Tuple[Any, ...], Tuple[Any, ...], float]:
        """For the priority contract: the launched requests' and the waiting
        queue's priority entries as this prefill's admission left them."""
        waiting = getattr(self.scheduler, "waiting_queue", None) or ()
        return (tuple([sglang_compat.priority_entry(r) for r in reqs]),
                tuple([sglang_compat.priority_entry(r) for r in waiting]), self._admission_from)

    def _in_flight_rows(self):
        """(rid, row) of the launched batches still in ``result_queue``, as
        recorded at their own launch: a finished request has given its row up
        by now, and reading the batch's index tensor would sync the device on
        this hot path."""
        queued = state.result_queue_batches(self.scheduler)
        if not queued:
            return ()
        out = []
        for batch in queued:
            rids = tuple([r.rid for r in batch.reqs])
            launched = next((rec for rec in reversed(self.counters.batch_log) if rec.rids == rids), None)
            if launched is not None:
                out.extend((rid, row) for rid, row in zip(launched.rids, launched.rows) if row is not None)
        return tuple(out)

    def on_crash(self, tb: str) -> None:
        try:
            self.observer.writer.close()  # the trace cut to its text before the process dies
        except OSError:
            pass
        try:
            try:
                # in the reset: the previous script's operations not yet settled (keep_unsettled),
                # then the reset's own (its continue_generation and abort_all)
                control_log = tuple(self.ledger.log())
            except Exception:  # noqa: BLE001 - the crash report must leave whatever the ledger holds
                control_log = None
            self._sock.send_pyobj(protocol.SchedulerCrashed(
                traceback=tb, script_stack=script_stack(self._script_gen), in_reset=self._resetting,
                control_log=control_log), flags=zmq.NOBLOCK)
            time.sleep(0.2)  # let the frame leave before the process dies
        except zmq.ZMQError:
            pass

    def _recording_dispatcher(self, dispatcher):
        def recording_dispatcher(recv_req):
            if isinstance(recv_req, RankKvOp):  # the harness's own, queued by kv_holds: no answer to anyone
                self.kv_holds.on_dispatch(recv_req)
                return None
            if self._reset_flushes_queued and sglang_compat.is_reset_flush(recv_req):
                # The reset's own flush: its answer is the driver's; the
                # tokenizer never asked, so nothing is sent back to it (also
                # for one a failed reset left queued).
                self._reset_flushes_queued -= 1
                self._reset_flush_answer = dispatcher(recv_req)
                sglang_compat.restart_policy_call_counters(self.scheduler)  # as every other rank (rank_ops)
                return None
            kind = type(recv_req).__name__
            if kind == contracts.ABORT_TYPE:
                self.tracker.on_abort(recv_req, self.scheduler)
            observers = []
            for memory in self.observer.dispatch_observers(kind):
                try:
                    observers.append((memory, memory.before_dispatch(self.scheduler, recv_req)))
                except Exception:  # noqa: BLE001 - a harness bug must not kill the scheduler
                    memory.harness_error = traceback.format_exc(limit=4)
            if kind in weight_trainer.TYPES:
                self.weight_trainer.before_dispatch(self.scheduler, recv_req)
            version = sglang_compat.served_weight_version()
            output = dispatcher(recv_req)
            self.tracker.on_version_change(version, sglang_compat.served_weight_version())
            if kind in weight_trainer.TYPES:
                self.weight_trainer.after_dispatch(self.scheduler, recv_req, output)
            memory_occupation.after_dispatch(self.scheduler, recv_req, output)
            runtime_contracts.after_dispatch(self.scheduler, recv_req, output)
            for memory, before in observers:
                try:
                    memory.on_dispatch(self.scheduler, recv_req, output, self.counters.step, before)
                except Exception:  # noqa: BLE001
                    memory.harness_error = traceback.format_exc(limit=4)
            self.ledger.on_processed(recv_req, output)
            if kind == "TokenizedGenerateReqInput":
                self.tracker.on_ingested(recv_req.rid, self.scheduler)
            return output

        recording_dispatcher.__wrapped__ = dispatcher
        return recording_dispatcher

    # --- the main generator -------------------------------------------------
    def _main(self) -> Generator[None, None, None]:
        yield from self._drain_warmup()
        self._sock.send_pyobj(protocol.Ready(info=self._info()))
        while True:
            cmd = self._sock.recv_pyobj()  # the scheduler is frozen here, by design
            if isinstance(cmd, protocol.Shutdown):
                self._sock.close()
                os._exit(0)
            if isinstance(cmd, protocol.Cancel):
                continue  # a cancel that raced with the end of its script
            if isinstance(cmd, protocol.RunScript):
                done = yield from self._run(cmd)
                self._sock.send_pyobj(done)
            else:
                raise RuntimeError(f"scripted-runtime driver: unknown command {cmd!r}")

    def _info(self) -> dict:
        pp_rank, tp_rank, pp_size, tp_size = sglang_compat.rank_info(self.scheduler)
        return {
            "sglang_version": sglang_compat.installed_sglang_version(),
            "loop_kind": sglang_compat.loop_kind(self.scheduler),
            "pp_size": pp_size,
            "tp_size": tp_size,
            "pid": os.getpid(),
            "iterations_to_ready": self.counters.iteration,
            "engine_stats": state.engine_stats(self.scheduler),
            "extensions": extensions.summary(),
        }

    def _drain_warmup(self) -> Generator[None, None, None]:
        """Run freely until the server warmup request was served and the
        engine stayed idle for two full microbatch rotations."""
        if os.environ.get(ENV_EXPECT_WARMUP, "1") != "1":
            return
        s = self.scheduler
        quiesce = 2 * (state.mbs_slots(s) or 1)
        deadline = time.monotonic() + WARMUP_TIMEOUT_S
        idle_streak = 0
        while idle_streak < quiesce:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"scripted-runtime: server warmup not served within {WARMUP_TIMEOUT_S:.0f}s "
                    f"(work requests seen: {self.inbox.work_reqs_seen}; {state.describe(s)})"
                )
            yield
            if self.inbox.work_reqs_seen > 0 and sglang_compat.is_fully_idle(s) and state.nothing_held(s):
                idle_streak += 1
            else:
                idle_streak = 0
                time.sleep(0.001)  # free-running before warmup: do not spin hot

    def _resume_released_memory(self, deadline: float) -> Generator[None, None, int]:
        """Resume what the previous script left released. First the releases
        and resumes it posted are let land (stepping: SGLang's tokenizer
        sends one operation of a type at a time, so a resume posted now would
        wait behind one still unprocessed, and an arrival wait taking no step
        would never see it); then what SGLang still holds released is resumed
        (a resume the script posted is not posted again: SGLang's handler
        raises KeyError on a tag not released). Bounded by iterations and the
        clock (a posted operation arrives after HTTP round trips). Returns
        the iterations used."""
        s = self.scheduler
        ctx = self.ctx
        steps = 0
        resume = None
        while True:
            pending = [op for op in self.ledger.ops if not op.processed
                       and op.name.startswith(MEMORY_OPS)
                       and not (op.http.done and not op.arrived)]  # answered by the tokenizer alone: settled
            if not pending:
                released = ctx.released_memory
                if not released:
                    return steps
                if resume is not None:
                    raise ResetError(f"the reset's {resume.name} was processed but left "
                                     f"{', '.join(released)} released; state: {state.describe(s)}")
                try:
                    resume = ctx.resume_memory_occupation(sorted(released))
                except (RuntimeError, ValueError) as e:
                    raise ResetError(f"the reset could not resume the memory the previous script released: {e}; "
                                     f"state: {state.describe(s)}") from e
                continue
            if steps >= RESET_MAX_STEPS and time.monotonic() > deadline:
                raise ResetError(
                    f"the reset waited {steps} iterations for {', '.join(op.name for op in pending)} to be "
                    f"processed (released now: {', '.join(ctx.released_memory) or 'nothing'}); "
                    f"state: {state.describe(s)}")
            yield
            steps += 1
            if steps > RESET_MAX_STEPS // 4:
                time.sleep(0.001)  # waiting for an HTTP round trip, not for iterations: do not spin hot

    def _reset(self, deadline: float = float("inf"), tokenizer_paused: bool = False) -> Generator[None, None, int]:
        """Bring the engine back to a clean idle state; returns iterations
        used. ``deadline`` (the script's own, monotonic) also bounds the wait
        for the previous script's unsettled operations, so a ResetError comes
        back before the harness gives up on the run. ``tokenizer_paused``:
        the previous script's last pause/continue was a pause (the tokenizer
        then holds every new request, whatever the scheduler's flag says: a
        script that failed right after its pause, a pause the scheduler
        ignored)."""
        s = self.scheduler
        ctx = self.ctx
        steps = 0
        hicache_gate.gate().reset()  # nothing held into the next script (copies the held ones now)
        self.weight_trainer.forget_error()  # its error, if any, was the previous script's failure
        if self._needs_drain() or tokenizer_paused:
            self._raise_if_tokenizer_wedged()
            if ctx.released_memory or ctx.released_memory_once_processed():
                # the RL order: memory back before generation continues (a continue
                # over released memory is refused: a GPU would fault)
                steps += yield from self._resume_released_memory(min(deadline, time.monotonic() + LEFTOVER_OP_WAIT_S))
            if sglang_compat.is_paused(s) or tokenizer_paused:
                ctx.continue_generation()
            self.kv_holds.release()
            if state.any_live(s) or self.inbox.pending():
                ctx.abort_all()
            # else only finished requests are still held (a script that
            # waited for its requests): the loop prunes them by itself, and
            # the abort_all post (an HTTP round trip) is saved.
            busy_steps = 0
            leftover_wait_s = max(0.0, min(LEFTOVER_OP_WAIT_S, deadline - time.monotonic()))
            leftover_deadline = time.monotonic() + leftover_wait_s
            while True:
                yield
                steps += 1
                unsettled = self.ledger.unsettled()
                if unsettled:
                    # An op the previous script posted without waiting for it
                    # (update_weights_from_disk behind the tokenizer's lock):
                    # it must land here, not in the next script. Waited for
                    # by time: it arrives after HTTP round trips, not after
                    # a number of iterations.
                    if time.monotonic() > leftover_deadline:
                        raise ResetError(
                            f"{', '.join(op.name for op in unsettled)} posted by the previous script "
                            f"was neither processed nor answered without reaching the scheduler within "
                            f"{leftover_wait_s:.0f}s; state: {state.describe(s)}")
                    time.sleep(0.001)
                    continue
                if self._engine_idle():
                    break
                busy_steps += 1
                if busy_steps >= RESET_MAX_STEPS:
                    raise ResetError(
                        f"the engine did not become idle within {RESET_MAX_STEPS} iterations "
                        f"of the reset; state: {state.describe(s)}"
                    )
        # else: the previous script left nothing behind; flushing right away
        # saves the abort_all iteration (one of the two a clean reset took).
        # The flush is handed to the scheduler's input directly, not posted
        # over HTTP: the same request object the tokenizer would send, read
        # by the same recv and forwarded to the other ranks the same way,
        # without the 2-4 ms round trip through the HTTP server and the
        # tokenizer (its answer is kept from the tokenizer, see
        # _recording_dispatcher). Scripts' own ctx.flush_cache() still posts.
        if self._fresh_fingerprint is not None:
            # restore posts what differs, one op of a kind SGLang serializes (LoRA unloads) at a
            # time: again until nothing is left
            # (an op SGLang's tokenizer sends after a wait of its own, a LoRA unload after the adapter's
            # requests answered, arrives after a wall-clock time, not a number of iterations)
            before = runtime_knobs.take(s)
            knobs = runtime_knobs.restore(ctx, self._fresh_fingerprint, before)
            while knobs:
                restore_deadline = time.monotonic() + RESTORE_OP_WAIT_S
                while not all(op.processed for op in knobs):
                    waiting = [op for op in knobs if not op.processed]
                    if time.monotonic() > restore_deadline:
                        arrived = all(op.arrived for op in waiting)
                        answers = "; ".join(f"{op.name} answered HTTP {op.http.status}: {str(op.http.body)[:200]}"
                                            for op in waiting if op.http.done)
                        raise ResetError(f"the reset's {', '.join(op.name for op in waiting)} was not processed "
                                         + ("" if arrived else "(it did not reach the scheduler) ")
                                         + f"within {RESTORE_OP_WAIT_S:.0f}s"
                                         + (f" ({answers})" if answers else "")
                                         + f"; state: {state.describe(s)}")
                    for op in waiting:  # with the tokenizer still: by the clock, not by iterations
                        if not op.arrived:
                            ctx.await_arrival(op, max(0.0, restore_deadline - time.monotonic()))
                    yield
                    steps += 1
                after = runtime_knobs.take(s)
                if after == before:
                    # processed, yet nothing they restore changed: posting them again would
                    # loop until the harness's script timeout (a close_session SGLang
                    # deferred on an idle engine, measured with a planted bug)
                    left = reset_fingerprint.diff({key: self._fresh_fingerprint.get(key) for key in after}, after)
                    raise ResetError(f"the reset's {', '.join(op.name for op in knobs)} "
                                     f"{'was' if len(knobs) == 1 else 'were'} processed but left the engine as it "
                                     f"was ({'; '.join(left)}); state: {state.describe(s)}")
                before = after
                knobs = runtime_knobs.restore(ctx, self._fresh_fingerprint, after)
        raw, req = sglang_compat.reset_flush_frame()
        self._reset_flush_answer = None
        self._reset_flushes_queued += 1
        self.inbox.inject(raw, req)
        yield
        steps += 1
        answer, self._reset_flush_answer = self._reset_flush_answer, None
        if answer is None:
            raise ResetError(f"the reset's flush_cache got no answer in the iteration after it was handed "
                             f"in (not dispatched yet, or deferred; frames still queued: "
                             f"{len(self.inbox.pending())}); "
                             f"state: {state.describe(s)}")
        if not getattr(answer, "success", False):
            raise ResetError(f"flush_cache during reset was refused: {answer!r}; state: {state.describe(s)}")
        # The script starts in this iteration. Under PP no slot needs a turn
        # first: nothing is held in any of them (checked above), the tree and
        # pools are shared by every slot, and the other ranks process the
        # flush before anything the script sends. But the script must start
        # at the same slot every time: the iterations a reset takes vary
        # with what the previous script left, and a script started at
        # another slot sees its requests batched at other steps (what its
        # step 0 posts lands in whichever slot comes next). Idle iterations
        # up to slot 0: at most pp_loop_size - 1 of them.
        slots = state.mbs_slots(s)
        turned = 0
        while slots and state.pp_slot(s) not in (None, 0):
            if turned >= slots:
                raise ResetError(f"the PP loop did not come round to slot 0 within {slots} iterations "
                                 f"after the flush; state: {state.describe(s)}")
            yield
            steps += 1
            turned += 1
        if self.weight_trainer.error:  # failed on an operation the previous script left to the reset
            raise ResetError(f"the trainer rank of a distributed weight update failed during the reset: "
                             f"{self.weight_trainer.error}")
        self._check_fingerprint()
        return steps

    def _raise_if_tokenizer_wedged(self) -> None:
        """A ``pause_generation(abort)`` of the previous script still
        unanswered holds SGLang's tokenizer in its drain loop, with the pause
        lock every ``continue_generation`` needs: the reset's continue could
        not be sent. Give it ``ABORT_PAUSE_GRACE_S`` to answer, then fail
        the reset at once, naming it, instead of after a continue's arrival
        timeout."""
        waiting = [op for op in self.ledger.unsettled() if op.name == "pause_generation(abort)"]
        if not waiting:
            return
        # a script that waited for the answer in vain already spent (part of) the grace
        if all(op.http.wait(max(0.0, ABORT_PAUSE_GRACE_S - op.http.waited_s)) for op in waiting):
            return
        raise ResetError(
            "a pause_generation(abort) of the previous script is still unanswered: SGLang's tokenizer sends "
            "abort_all until no request holds its lock, holding the pause lock continue_generation needs, so the "
            "reset cannot continue generation (requests an in_place pause keeps from ending never release it: "
            f"known bug abort_pause_during_in_place_pause); the server must be restarted; state: "
            f"{state.describe(self.scheduler)}")

    def _check_fingerprint(self) -> None:
        """The first reset of this server's life records what a fresh engine
        looks like; every later one must give the same back
        (``reset_fingerprint``), or it is a ResetError naming what was left."""
        now = reset_fingerprint.take(self.scheduler)
        if self._fresh_fingerprint is None:
            self._fresh_fingerprint = now
            return
        left = reset_fingerprint.diff(self._fresh_fingerprint, now)
        if left:
            raise ResetError("the reset did not give back the engine a fresh server has (an earlier script "
                             "changed what it cannot restore): " + "; ".join(left)
                             + f"; state: {state.describe(self.scheduler)}")

    def _engine_idle(self) -> bool:
        """Idle by the scheduler's own gate and by the harness's scan, with
        nothing arrived and not yet ingested: what the reset's flush needs."""
        s = self.scheduler
        return sglang_compat.is_fully_idle(s) and state.nothing_held(s) and not self.inbox.pending()

    def _needs_drain(self) -> bool:
        """Whether the reset must abort and wait: anything paused, held,
        queued, taken by ``exhaust_kv`` or posted and not yet settled."""
        return (sglang_compat.is_paused(self.scheduler) or self.kv_holds.holding
                or bool(sglang_compat.released_memory_tags(self.scheduler))
                or bool(self.ledger.unsettled()) or not self._engine_idle())

    def _run(self, cmd: protocol.RunScript) -> Generator[None, None, protocol.ScriptDone]:
        started = time.monotonic()
        counters = self.counters

        def done(passed: bool, error: Optional[str] = None, tb: Optional[str] = None,
                 value: Any = None, reset_steps: int = 0,
                 violation: Optional[dict] = None, stack=None) -> protocol.ScriptDone:
            self._script_gen = None
            try:
                pickle.dumps(value)
            except Exception:  # noqa: BLE001
                value = repr(value)
            window_counts = self.observer.end() if observing else {}
            states = self.observer.abstract_states() if observing else ()
            return protocol.ScriptDone(
                passed=passed, steps=counters.step, reset_steps=reset_steps,
                duration_s=time.monotonic() - started, error=error, traceback=tb,
                control_log=self.ledger.log(), value=value, violation=violation,
                windows=window_counts,
                timeline="" if passed or not observing else self.observer.timeline_tail(),
                reset_s=reset_s, io_s=counters.io_s, script_stack=stack, states=states,
            )

        observing = False
        reset_s = 0.0
        counters.step = 0
        counters.io_s = 0.0
        try:
            fn = script_loader.load(cmd.target)
        except script_loader.ScriptLoadError as exc:
            return done(False, f"ScriptLoadError: {exc}")

        tokenizer_paused = control.pause_posted_last(self.ledger.ops)
        self.ledger.keep_unsettled()  # the reset waits for those
        self._resetting = True
        try:
            reset_steps = yield from self._reset(started + cmd.timeout_s, tokenizer_paused=tokenizer_paused)
        except (ResetError, ArrivalTimeout) as exc:
            # an operation of the reset that never reached the scheduler (a tokenizer wedged by the
            # previous script) is the reset failing, not the scheduler: this script is not run
            return done(False, f"ResetError: {exc}", traceback.format_exc())
        finally:
            self._resetting = False
        reset_s = time.monotonic() - started
        counters.io_s = 0.0
        self.ledger.clear()
        self.tracker.clear()
        counters.batch_log.clear()
        counters.step = 0
        try:
            self.observer.begin(cmd)
        except (ValueError, OSError) as exc:
            return done(False, f"{type(exc).__name__}: {exc}", reset_steps=reset_steps)
        observing = True

        try:
            gen = fn(self.ctx, *cmd.args, **cmd.kwargs)
        except Exception as exc:
            return done(False, _one_line(exc), traceback.format_exc(), reset_steps=reset_steps)
        if not inspect.isgenerator(gen):
            return done(
                False,
                f"NotAGenerator: {cmd.target.describe()} returned {type(gen).__name__}, "
                "not a generator; a script must `yield` (one yield = one scheduler iteration)",
                reset_steps=reset_steps,
            )
        self._script_gen = gen
        deadline = started + cmd.timeout_s
        next_cancel_poll = 0.0
        while True:
            self.observer.observe_windows()
            finished = False
            try:
                next(gen)
            except StopIteration as stop:
                finished, value = True, stop.value
            except Exception as exc:
                return done(False, _one_line(exc), traceback.format_exc(), reset_steps=reset_steps,
                            stack=exception_stack(exc, gen))
            try:
                violation = self.observer.after_script()
            except Exception as exc:  # a harness bug must not kill the scheduler
                gen.close()
                return done(False, f"HarnessError: the step observer raised {_one_line(exc)}",
                            traceback.format_exc(), reset_steps=reset_steps)
            if violation is not None:
                stack = script_stack(gen)
                gen.close()
                owners = "; ".join(f"{rid}: row {o['row']} in {'+'.join(o['holders'])}"
                                   for rid, o in violation.owners.items())
                return done(False, f"{violation.headline()} (iteration {violation.iteration})"
                            + (f"; owners: {owners}" if owners else ""),
                            violation=violation.as_dict(), reset_steps=reset_steps, stack=stack)
            if self.weight_trainer.error:
                stack = script_stack(gen)
                gen.close()
                return done(False, f"TrainerError: {self.weight_trainer.error}", reset_steps=reset_steps,
                            stack=stack)
            if finished:
                return done(True, value=value, reset_steps=reset_steps)
            problem = None
            now = time.monotonic()
            if counters.step >= cmd.max_steps:
                problem = f"StepBudgetExceeded: script still running after {cmd.max_steps} steps"
            elif now > deadline:
                problem = f"ScriptTimeout: script still running after {cmd.timeout_s:.0f}s"
            elif now >= next_cancel_poll:  # a socket poll every iteration costs more than the wait
                next_cancel_poll = now + CANCEL_POLL_S
                if self._sock.poll(0):
                    msg = self._sock.recv_pyobj()
                    if isinstance(msg, protocol.Cancel):
                        problem = f"Cancelled: {msg.reason}"
            if problem:
                stack = script_stack(gen)
                gen.close()
                return done(False, f"{problem}; state: {self.ctx.describe()}", reset_steps=reset_steps,
                            stack=stack)
            counters.step += 1
            yield


def script_stack(gen: Any) -> Optional[tuple]:
    """(file, line, function) of a suspended script generator and of the
    generators it delegates to (``yield from``), outermost first."""
    frames = []
    while gen is not None and inspect.isgenerator(gen):
        frame = gen.gi_frame
        if frame is None:
            break
        frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        gen = gen.gi_yieldfrom
    return tuple(frames) or None


def exception_stack(exc: BaseException, gen: Any) -> Optional[tuple]:
    """(file, line, function) of the frames an exception raised in a script
    went through, from the script's own function inwards."""
    frames = [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(exc.__traceback__)]
    top = getattr(gen, "gi_code", None)
    for i, (filename, _, name) in enumerate(frames):
        if top is not None and filename == top.co_filename and name == top.co_name:
            return tuple(frames[i:])
    return tuple(frames) or None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
