"""The object a script receives: ``def script(ctx, *args): ... yield ...``.

One ``yield`` is one scheduler iteration (one microbatch slot under PP).
Requests and control operations go through the server's real HTTP API; the
context waits (bounded) until each has reached the scheduler's socket before
returning, so the next iteration ingests it. ``update_weights_from_disk`` is
the exception: the tokenizer holds it behind a writer lock that only
scheduler progress releases, so it is posted fire-and-forget; step with
``yield from op.wait()``.
"""
from __future__ import annotations

import itertools
import os
import time
from typing import Any, Callable, Dict, List, Optional, Union

from scripted_runtime import control_catalog
from scripted_runtime.hooks import hicache_gate, sglang_compat
from scripted_runtime.protocol import ENV_CHECKPOINT
from scripted_runtime.scheduler_side import control, hicache_state, state, windows
from scripted_runtime.scheduler_side.context import radix, waits
from scripted_runtime.scheduler_side.context.distributed_updates import DistributedUpdates
from scripted_runtime.scheduler_side.context.lora_ops import LoraOps
from scripted_runtime.scheduler_side.context.requests import ReqHandle
from scripted_runtime.scheduler_side.context.runtime_ops import RuntimeOps, SessionOps
from scripted_runtime.scheduler_side.context.tensor_updates import TensorUpdates
from scripted_runtime.scheduler_side.control import ControlLedger, ControlOp
from scripted_runtime.scheduler_side.http_poster import HttpPoster
from scripted_runtime.scheduler_side.inbox import NO_FRAME_GRACE_S, ArrivalTimeout, TokenizerInbox
from scripted_runtime.scheduler_side.rank_ops import KvPressure
from scripted_runtime.scheduler_side.request_tracker import RequestTracker
from scripted_runtime.scheduler_side.run_counters import BatchRecord, RunCounters
from scripted_runtime.scheduler_side.step_observer import StepObserver
from scripted_runtime.scheduler_side.weight_trainer import WeightTrainer

ARRIVAL_TIMEOUT_S = 30.0
# the names (up to their tag list) of the ops that release and resume memory
MEMORY_OPS = ("release_memory_occupation", "resume_memory_occupation")

_rid_counter = itertools.count()


def _new_rid() -> str:
    """A rid of the run's usual form (``r<n>-<pid>-<ns>``: the determinism check reads it as a rid)."""
    return f"r{next(_rid_counter)}-{os.getpid()}-{time.monotonic_ns() % 10**6}"


class ScriptContext(RuntimeOps, SessionOps, TensorUpdates, DistributedUpdates, LoraOps):
    """Built by the driver, which hands it the parts of the run it works
    with: the scheduler, the run's counters, the control ledger, the HTTP
    poster, the request tracker, the tokenizer inbox, the KV the script
    holds, the step observer (windows and checks) and the trainer rank of
    distributed weight updates."""

    def __init__(self, *, scheduler: Any, counters: RunCounters, ledger: ControlLedger, poster: HttpPoster,
                 tracker: RequestTracker, inbox: TokenizerInbox, kv_holds: KvPressure,
                 observer: StepObserver, weight_trainer: WeightTrainer) -> None:
        self._scheduler = scheduler
        self._counters = counters
        self._ledger = ledger
        self._poster = poster
        self._tracker = tracker
        self._inbox = inbox
        self._kv_holds = kv_holds
        self._observer = observer
        self.weight_trainer = weight_trainer
        # Called as listener(op, payload) right after each control operation
        # is posted (the state then is what the next iteration starts from).
        self.control_listeners: List[Callable[[ControlOp, Optional[dict]], None]] = []

    # --- direct access ---------------------------------------------------------
    @property
    def scheduler(self) -> Any:
        return self._scheduler

    @property
    def step(self) -> int:
        """Iterations this script has run so far."""
        return self._counters.step

    @property
    def loop_kind(self) -> str:
        return sglang_compat.loop_kind(self.scheduler)

    @property
    def batch_log(self) -> List[BatchRecord]:
        return self._counters.batch_log

    @property
    def control_ops(self) -> List[ControlOp]:
        return self._ledger.ops

    def unprocessed_ops(self, name: str) -> List[ControlOp]:
        """This script's ops called ``name`` posted but not processed yet."""
        return self._ledger.unprocessed(name)

    def unsettled_ops_of_type(self, request_type: str) -> List[ControlOp]:
        """This script's ops of scheduler request type ``request_type`` (e.g.
        ``"CheckWeightsReqInput"``) not settled yet (``ControlOp.settled``): what
        SGLang's tokenizer, sending one of a type at a time, still holds a
        next one behind."""
        return self._ledger.unprocessed_of_type(request_type)

    # --- requests ----------------------------------------------------------------
    def start_req(
        self,
        *,
        prompt_len: Optional[int] = None,
        max_new_tokens: int = 8,
        rid: Optional[str] = None,
        ignore_eos: bool = False,
        prompt_token: int = 1,
        input_ids: Optional[List[int]] = None,
        temperature: Optional[float] = None,
        stop_token_ids: Optional[List[int]] = None,
        stop: Optional[List[str]] = None,
        top_logprobs: int = 0,
        logprob_start_len: Optional[int] = None,
        stream: bool = False,
        lora: Optional[str] = None,
        session: Optional[str] = None,
        after: Optional[ReqHandle] = None,
        priority: Optional[int] = None,
        await_arrival: bool = True,
    ) -> ReqHandle:
        """Send a generate request of ``prompt_len`` copies of ``prompt_token``
        (or explicit ``input_ids``); returns once it reached the scheduler.
        ``top_logprobs=k`` asks SGLang for the k best logprobs of every output
        token (``return_logprob``), read back with ``handle.top_logprobs``.
        ``logprob_start_len=s`` asks for logprobs (``return_logprob``) and
        for the prompt's input logprobs from token ``s`` on (-1: output
        tokens only, SGLang's default); the logprob contract judges them.
        ``stream=True`` asks for a streamed answer: ``handle.http.chunks``
        holds every event, ``handle.http.body`` the last. ``lora=NAME``
        serves it with LoRA adapter NAME (loaded: ``ctx.load_lora_adapter``;
        SGLang's tokenizer refuses a name not loaded). ``session=ID``: a turn
        of open session ID (``ctx.open_session``), continuing after request
        ``after`` of it (a handle; None: the session's first turn): SGLang
        builds its prompt from the history, ``after``'s prompt and output
        then ``input_ids``, and the output oracle compares it with a fresh
        request of that whole history (``handle.expected_prompt``, computed
        from what this script sent and was answered, not from SGLang's own
        record). ``after`` must have finished (SGLang aborts a turn after an
        unfinished one). ``priority=P``: the request's priority, for a server
        with priority scheduling on (``--topology pp1-priority``: higher
        values first; SGLang ignores it otherwise). ``stop=[...]``: stop
        strings, for a server with a tokenizer (``--topology pp1-text``;
        SGLang refuses them without one); the request contract judges them
        (``scheduler_side/stop_strings.py``)."""
        if input_ids is None:
            if prompt_len is None or prompt_len < 1:
                raise ValueError("start_req needs prompt_len >= 1 or input_ids")
            input_ids = [prompt_token] * prompt_len
        rid = rid or _new_rid()
        sampling: Dict[str, Any] = {"max_new_tokens": max_new_tokens, "ignore_eos": ignore_eos}
        if temperature is not None:
            sampling["temperature"] = temperature
        if stop_token_ids is not None:
            sampling["stop_token_ids"] = stop_token_ids
        if stop is not None:
            sampling["stop"] = list(stop)
        payload = {"input_ids": input_ids, "sampling_params": sampling, "rid": rid, "stream": bool(stream)}
        if top_logprobs or logprob_start_len is not None:
            payload["return_logprob"] = True
        if top_logprobs:
            payload["top_logprobs_num"] = top_logprobs
        if logprob_start_len is not None:
            payload["logprob_start_len"] = logprob_start_len
        if lora is not None:
            self._lora_ready_for_request(lora)
            payload["lora_path"] = lora
        if priority is not None:
            payload["priority"] = int(priority)
        expected_prompt = None
        if after is not None and session is None:
            raise ValueError("start_req: after= continues a session turn; name the session (session=ID)")
        if session is not None:
            payload["session_params"] = {"id": session, "rid": after.rid if after is not None else None}
            expected_prompt = list(input_ids) if after is None else after.session_history(input_ids)
        handle = self._post_generate(payload, await_arrival=await_arrival, raw=False)
        handle.lora = lora
        handle.expected_prompt = expected_prompt
        handle.session = session
        handle.max_new_tokens = max_new_tokens
        handle.logprob_start_len = logprob_start_len
        handle.priority = priority
        return handle

    def send_generate(self, payload: Dict[str, Any], *, await_arrival: bool = True) -> ReqHandle:
        """Post ``payload`` to ``/generate`` as it is: nothing added but a rid
        when it has none, nothing checked (request fuzzing: malformed or
        extreme fields, ``scheduler_side/request_fuzz.py``). Returns once the
        scheduler took a request of its rid in, or the HTTP server answered
        without sending it on (a refusal: ``handle.status == "refused"``).
        The handle is marked ``raw``: the checks that assume ``start_req``'s
        shape (the output oracle, the request contract, answer delivery)
        leave it to the survival contract."""
        payload = dict(payload)
        if not isinstance(payload.get("rid"), str) or not payload.get("rid"):
            payload["rid"] = _new_rid()
        return self._post_generate(payload, await_arrival=await_arrival, raw=True)

    def post_http(self, path: str, payload: Optional[Dict[str, Any]] = None, *, method: str = "POST",
                  unchecked: bool = False) -> Any:
        """Post ``payload`` to any route of the server's HTTP API (with the
        harness's key) and return its ``HttpAnswer`` at once (``wait(timeout_s)``,
        ``status``, ``body``): for the routes the harness does not script yet
        (docs/control-requests.md). Not an operation handle: nothing waits
        for it to reach the scheduler and no contract follows it.

        Refused with a one-line ``ValueError`` (``control_catalog``): a
        route a ``ctx`` method scripts (the error names it), one that kills
        the scheduler on 0.5.23 (a registered bug) and one the scheduler
        would block on; ``unchecked=True`` sends it anyway (a known bug's
        scenario does)."""
        if not unchecked:
            refusal = control_catalog.post_refusal(path, method)
            if refusal is not None:
                raise ValueError(refusal)
        return self._poster.post(path, payload, method=method)

    def _post_generate(self, payload: Dict[str, Any], *, await_arrival: bool, raw: bool) -> ReqHandle:
        self._refuse_while_released("a generate request", paused_ok=True)
        rid = payload["rid"]
        work_types = sglang_compat.work_request_type_names()
        arrived: List[Any] = []

        def on_frame(obj: Any) -> None:  # a frame of this rid reaching the scheduler's socket
            if getattr(obj, "rid", None) == rid and type(obj).__name__ in work_types:
                arrived.append(obj)

        t0 = time.monotonic()
        # Counted from the post on, not found in the buffer: an earlier request of the same rid
        # (a reused one) must not count as this one's arrival.
        self._inbox.arrival_listeners.append(on_frame)
        try:
            answer = self._poster.post("/generate", payload)
            handle = ReqHandle(rid, answer, self.step, scheduler=self._scheduler, tracker=self._tracker,
                               counters=self._counters, raw=raw, payload=payload if raw else None)
            self._tracker.handles.append(handle)
            if await_arrival:
                self._inbox.wait_for(
                    None,
                    timeout_s=ARRIVAL_TIMEOUT_S,
                    what=f"generate request {rid!r}",
                    already_arrived=lambda: bool(arrived) or answer.done,
                )
        finally:
            self._inbox.arrival_listeners.remove(on_frame)
        handle.arrived = bool(arrived)
        self._counters.io_s += time.monotonic() - t0
        return handle

    # --- control operations --------------------------------------------------
    def _control(
        self,
        name: str,
        path: str,
        payload: Optional[dict],
        request_type: str,
        *,
        rid: Optional[str] = None,
        await_arrival: bool = True,
        method: str = "POST",
    ) -> ControlOp:
        t0 = time.monotonic()
        answer = self._poster.post(path, payload, method=method)
        op = self._ledger.register(
            ControlOp(name=name, request_type=request_type, rid=rid,
                      posted_step=self.step, http=answer, payload=dict(payload or {}))
        )
        op.describe = self.describe
        if await_arrival:
            self._wait_arrival(op, ARRIVAL_TIMEOUT_S)
        self._counters.io_s += time.monotonic() - t0
        for listener in self.control_listeners:
            listener(op, payload)
        return op

    def _wait_arrival(self, op: ControlOp, timeout_s: float) -> None:
        """Block, without stepping, until ``op`` reached the scheduler's
        socket, or was answered over HTTP and no frame followed within
        ``NO_FRAME_GRACE_S`` (the tokenizer answered it itself); raises
        ``ArrivalTimeout`` after ``timeout_s``. Arrival is the ledger's
        verdict (it pairs frames with ops in order): an earlier op's frame of
        the same type, still buffered, must not count as this one's."""
        done_at: List[float] = []

        def arrived_or_answered() -> bool:
            if op.arrived:
                return True
            if not op.http.done:
                return False
            done_at.append(time.monotonic())
            return done_at[-1] - done_at[0] >= NO_FRAME_GRACE_S

        self._inbox.wait_for(None, timeout_s=timeout_s, what=f"{op.name} ({op.request_type})",
                             already_arrived=arrived_or_answered)

    def await_arrival(self, op: ControlOp, timeout_s: float) -> bool:
        """Block, without stepping the scheduler, until ``op``'s request
        reached the scheduler's socket (it is then processed in the next
        iteration) or was answered over HTTP without reaching it, or
        ``timeout_s`` passed; True when it arrived. For an op SGLang's
        tokenizer sends after a wait of its own that needs no scheduler
        iteration (a LoRA unload once its adapter's requests have finished):
        waiting by iterations would make a program's steps depend on the
        tokenizer's timing."""
        if op.arrived or op.processed:
            return True
        try:
            self._wait_arrival(op, timeout_s)
        except ArrivalTimeout:
            pass
        return op.arrived

    def await_frame(self, request_type: str, timeout_s: float) -> bool:
        """Block, without stepping, until a frame of ``request_type`` (e.g.
        ``"AbortReq"``) reached the scheduler's socket and is not ingested
        yet, or ``timeout_s`` passed; True when one is there. For a frame
        SGLang's tokenizer sends on its own (the last ``abort_all`` of a
        ``pause_generation(abort)``, sent right before its answer)."""
        try:
            self._inbox.wait_for(lambda f: type(f).__name__ == request_type, timeout_s=timeout_s,
                                 what=request_type)
        except ArrivalTimeout:
            return False
        return True

    def flush_cache(self) -> ControlOp:
        """Ask for a cache flush. ``op.success`` is False when the scheduler's
        idle gate refused it (visible after the next yield).

        The tokenizer sends flushes one at a time (it waits for each answer),
        so a second flush before the first was processed could not reach the
        scheduler: that raises at once; yield first."""
        pending = self._ledger.unprocessed("flush_cache")
        if pending:
            raise RuntimeError(
                f"flush_cache: the flush posted at step {pending[0].posted_step} has not been processed yet, and "
                "the tokenizer sends flushes one at a time (it waits for each answer), so this one could not "
                "reach the scheduler; yield (or `yield from op.wait()`) before flushing again")
        return self._control("flush_cache", "/flush_cache", None, "FlushCacheReqInput")

    def pause_generation(self, mode: str = "retract") -> ControlOp:
        """Post ``/pause_generation``. ``in_place`` and ``retract`` reach the
        scheduler (processed in the next iteration). ``abort`` never does:
        SGLang's tokenizer flags itself paused (holding new requests until
        continue) and sends ``abort_all`` until no request holds its lock,
        every second (in the harness's servers woken as soon as the lock is
        free: hooks/pause_abort_wake.py), answering only then; this returns once its first
        ``abort_all`` reached the scheduler (processed in the next
        iteration), and ``op.http`` answers after the requests ended
        (``yield`` until they are, then ``op.http.wait(s)``)."""
        if mode not in ("retract", "in_place", "abort"):
            raise ValueError(f"pause_generation mode must be retract|in_place|abort, got {mode!r}")
        if mode != "abort":
            return self._control(f"pause_generation({mode})", "/pause_generation", {"mode": mode},
                                 "PauseGenerationReqInput")
        aborts: List[Any] = []

        def on_frame(obj: Any) -> None:
            if type(obj).__name__ == "AbortReq" and getattr(obj, "abort_all", False):
                aborts.append(obj)

        self._inbox.arrival_listeners.append(on_frame)
        try:
            op = self._control("pause_generation(abort)", "/pause_generation", {"mode": mode},
                               "PauseGenerationReqInput", await_arrival=False)
            op.forwarded = False  # a later retract pause's request is not this one's
            self._inbox.wait_for(None, timeout_s=ARRIVAL_TIMEOUT_S,
                                 what="the abort_all SGLang's tokenizer sends for pause_generation(abort)",
                                 already_arrived=lambda: bool(aborts))
        finally:
            self._inbox.arrival_listeners.remove(on_frame)
        return op

    def continue_generation(self, *, torch_empty_cache: bool = False) -> ControlOp:
        self._refuse_while_released("continue_generation", paused_ok=False)
        return self._control(
            "continue_generation", "/continue_generation",
            {"torch_empty_cache": torch_empty_cache}, "ContinueGenerationReqInput",
        )

    def abort(self, handle: Union[ReqHandle, str]) -> ControlOp:
        rid = handle if isinstance(handle, str) else handle.rid
        return self._control(
            f"abort({rid})", "/abort_request", {"rid": rid, "abort_all": False},
            "AbortReq", rid=rid,
        )

    def abort_all(self) -> ControlOp:
        return self._control(
            "abort_all", "/abort_request", {"rid": "", "abort_all": True}, "AbortReq"
        )

    def update_weights_from_disk(
        self,
        model_path: Optional[str] = None,
        *,
        flush_cache: bool = True,
        load_format: Optional[str] = None,
        abort_all_requests: bool = False,
        await_arrival: bool = False,
        weight_version: Optional[str] = None,
    ) -> ControlOp:
        """Post /update_weights_from_disk; ``yield from op.wait()`` until the
        scheduler processed it. ``model_path`` defaults to the harness's
        checkpoint (a tiny safetensors file for the tiny model, the served
        model otherwise).

        By default the post is fire-and-forget: the tokenizer holds the update
        behind a writer lock that waits for every in-flight generate request,
        so it reaches the scheduler some iterations later. With
        ``await_arrival=True`` the call blocks (bounded) until it reached the
        scheduler, so it is processed in the very next iteration, run after
        run. That works when no generate request is in flight any more (e.g.
        inside ``finished_not_pruned``) or after a ``pause_generation`` (the
        tokenizer lets an update skip its lock while paused: the RL
        weight-update loop). With a request of this script still generating
        and no pause posted, the update could not arrive while the scheduler
        is frozen, so that raises at once instead of waiting."""
        path = model_path or os.environ.get(ENV_CHECKPOINT)
        if not path:
            raise ValueError("update_weights_from_disk needs model_path (no harness checkpoint is set)")
        if "weights" in self.released_memory:
            raise RuntimeError(
                "update_weights_from_disk: the weights memory is released (release_memory_occupation); on a GPU "
                "with the memory saver its pages are unmapped and loading into them faults. Resume it first: "
                "ctx.resume_memory_occupation(['weights']) (the RL order: resume weights, update, resume the "
                "KV cache, continue)")
        if await_arrival:
            self._refuse_update_behind_lock()
        payload: Dict[str, Any] = {
            "model_path": path,
            "flush_cache": flush_cache,
            "abort_all_requests": abort_all_requests,
        }
        if weight_version is not None:  # the served version label after it (as update_weight_version sets)
            payload["weight_version"] = weight_version
        if load_format is not None:
            payload["load_format"] = load_format
        elif os.environ.get(ENV_CHECKPOINT) == path:
            payload["load_format"] = "safetensors"
        return self._control(
            "update_weights_from_disk", "/update_weights_from_disk", payload,
            "UpdateWeightFromDiskReqInput", await_arrival=await_arrival,
        )

    # --- release/resume_memory_occupation (the RL weight-sync cycle) --------------
    @property
    def released_memory(self) -> tuple:
        """The memory tags released and not resumed, as SGLang records them
        (``offload_tags``; this rank's): ``kv_cache``, ``weights``, ``cuda_graph``."""
        return sglang_compat.released_memory_tags(self._scheduler)

    @property
    def memory_release_allowed(self) -> bool:
        """Whether SGLang's precondition of ``release_memory_occupation``
        holds now (``is_fully_idle``, waiting requests allowed while paused)
        and nothing that changes it is queued ahead (a request, a pause, a
        continue, an abort not processed yet): False means the release could
        kill the scheduler on its assert."""
        return sglang_compat.memory_release_allowed(self._scheduler) and not self._queued_ahead()

    def released_memory_once_processed(self) -> set:
        """SGLang's released tags once the releases and resumes this script
        posted, not processed yet, are (in posting order)."""
        tags = set(self.released_memory)
        for op in self._ledger.ops:
            if op.processed or not op.name.startswith(MEMORY_OPS):
                continue
            named = op.name[op.name.index("(") + 1:-1].split(",")
            if op.name.startswith("release"):
                tags.update(named)
            else:
                tags.difference_update(named)
        return tags

    def _queued_ahead(self) -> List[str]:
        """What reached the scheduler's socket, is not ingested yet and
        changes what SGLang's idle assert sees when it processes an operation
        posted now, ahead of it: a generate (or embedding) request (it joins
        the waiting queue), a pause or a continue (the assert lets waiting
        requests be only while paused), an abort."""
        work = sglang_compat.work_request_type_names()
        moving = ("PauseGenerationReqInput", "ContinueGenerationReqInput", "AbortReq")
        return [type(f).__name__ + (f" {f.rid}" if type(f).__name__ in work else "")
                for f in self._inbox.pending() if type(f).__name__ in work or type(f).__name__ in moving]

    def release_memory_occupation(self, tags: Optional[List[str]] = None) -> ControlOp:
        """Post ``/release_memory_occupation`` (``tags``: any of ``kv_cache``,
        ``weights``, ``cuda_graph``; None: all); processed in the next
        iteration. SGLang **asserts** the engine idle there (waiting requests
        allowed while paused): a release sent busy kills the scheduler, which
        SGLang documents as the caller's precondition ("should be called only
        when server is idle"), so this raises instead when it does not hold
        now (``memory_release_allowed``): pause with ``retract`` or wait for
        idle first. Releasing a tag already released raises too. KV this
        script took with ``exhaust_kv`` is given back first (the release
        flushes the allocator, as ``flush_cache`` does). On the CPU default
        the harness overwrites what was released (``memory_occupation``), as
        a GPU loses it: weights must be loaded again (an update) before
        generation continues."""
        names = self._memory_tags(tags, "release_memory_occupation")
        again = [t for t in names if t in self.released_memory_once_processed()]
        if again:
            raise RuntimeError(f"release_memory_occupation: {', '.join(again)} already released, or its release "
                               f"posted (SGLang's offload_tags: {', '.join(self.released_memory) or 'empty'}); "
                               "resume it first")
        if not self.memory_release_allowed:
            queued = self._queued_ahead()
            why = (f"{', '.join(queued[:4])} reached the scheduler ahead of it and change what the assert sees "
                   "(yield until they are processed)" if queued else f"the engine is not idle ({self.describe()})")
            raise RuntimeError(
                f"release_memory_occupation: SGLang asserts the engine idle (waiting requests allowed while "
                f"paused) and would kill the scheduler: {why}. Pause with mode='retract' (or let the requests "
                "finish) first")
        self.release_exhausted_kv()
        return self._control(f"release_memory_occupation({','.join(names)})", "/release_memory_occupation",
                             {"tags": list(tags) if tags else None}, "ReleaseMemoryOccupationReqInput")

    def resume_memory_occupation(self, tags: Optional[List[str]] = None) -> ControlOp:
        """Post ``/resume_memory_occupation`` for ``tags`` (None: every tag
        released, named; SGLang's own "no tags" means all three); processed
        in the next iteration. Raises when a tag is not released, counting
        the releases and resumes this script posted and SGLang has not
        processed yet:
        SGLang's handler removes each from ``offload_tags`` with
        ``set.remove`` (a KeyError in the scheduler). After resuming
        ``weights`` on the CPU default, the parameters are the garbage the
        release left until a weight update loads them (as on a GPU)."""
        released = self.released_memory_once_processed()
        if not tags:  # everything released, named (SGLang's "no tags" means all three)
            tags = sorted(released)
            if not tags:
                raise RuntimeError("resume_memory_occupation: nothing is released (SGLang's offload_tags is empty "
                                   "once the operations posted are processed)")
        names = self._memory_tags(tags, "resume_memory_occupation")
        missing = [t for t in names if t not in released]
        if missing:
            raise RuntimeError(f"resume_memory_occupation: {', '.join(missing)} not released, or its resume posted "
                               f"already (released once the posted operations are processed: "
                               f"{', '.join(sorted(released)) or 'nothing'}); SGLang's handler would raise KeyError "
                               "on it")
        return self._control(f"resume_memory_occupation({','.join(names)})", "/resume_memory_occupation",
                             {"tags": list(names)}, "ResumeMemoryOccupationReqInput")

    @staticmethod
    def _memory_tags(tags: Optional[List[str]], what: str) -> tuple:
        if tags is None or len(tags) == 0:
            return sglang_compat.MEMORY_TAGS
        if isinstance(tags, str):
            raise TypeError(f"{what}: tags is a list of tag names, got the string {tags!r}")
        unknown = [t for t in tags if t not in sglang_compat.MEMORY_TAGS]
        if unknown:
            raise ValueError(f"{what}: unknown tag(s) {', '.join(map(repr, unknown))}; SGLang's tags are "
                             + ", ".join(sglang_compat.MEMORY_TAGS))
        return tuple(tags)

    def _refuse_while_released(self, what: str, *, paused_ok: bool) -> None:
        """Refuse what would run a forward over released KV or weights (a
        fault on a GPU, where the memory saver unmapped them): a generate
        request while generation is not paused (a paused tokenizer holds it
        until continue), or continue_generation."""
        released = [t for t in self.released_memory if t in ("kv_cache", "weights")]
        if not released or (paused_ok and control.pause_posted_last(self.control_ops)):
            return
        raise RuntimeError(
            f"{what}: {' and '.join(released)} memory is released (release_memory_occupation) and generation is "
            "not held, so SGLang would run a forward over it (on a GPU: unmapped memory). Resume it first "
            "(ctx.resume_memory_occupation(...); after resuming weights, load them with an update)")

    def _refuse_update_behind_lock(self) -> None:
        """An awaited weight update the tokenizer would hold behind its
        writer lock until requests end that need scheduler iterations to end:
        fail now, naming them, rather than after ARRIVAL_TIMEOUT_S frozen."""
        if control.pause_posted_last(self.control_ops):
            return
        generating = [h.rid for h in self._tracker.handles if not h.finished]
        if generating:
            shown = ", ".join(generating[:4]) + (f" and {len(generating) - 4} more" if len(generating) > 4 else "")
            raise RuntimeError(
                f"update_weights_from_disk(await_arrival=True): request(s) {shown} of this script are still "
                "generating and generation is not paused; SGLang's tokenizer holds a weight update behind a "
                "writer lock until every in-flight generate request has ended, which needs scheduler "
                "iterations, so it could not reach the frozen scheduler. Pause first "
                "(ctx.pause_generation(...): a paused tokenizer lets the update skip the lock), or post it "
                "without await_arrival and `yield from op.wait()`")

    def exhaust_kv(self, *, leave_pages: int = 0) -> int:
        """Take KV slots from the allocator until ``leave_pages`` pages remain
        (given back at the next reset); returns the tokens taken. Under
        pipeline parallelism every rank takes them from its own pools when
        the next iteration ingests (``scheduler_side/rank_ops.py``), so the
        ranks keep agreeing on what fits; the count returned is what this
        rank will take."""
        return self._kv_holds.take(leave_pages * self.engine_stats()["page_size"])

    def evict_cache(self) -> int:
        """Evict every evictable (unlocked) token of the radix tree back to
        the allocator now, as SGLang's allocation does under memory pressure;
        returns the tokens evicted. With ``exhaust_kv`` after it, decoding
        runs short at once (there is no cache left to evict instead). Under
        pipeline parallelism every rank evicts its own tree when the next
        iteration ingests, before an ``exhaust_kv`` called after it."""
        return self._kv_holds.evict()

    def release_exhausted_kv(self) -> int:
        """Give back every KV slot ``exhaust_kv`` took, now instead of at the
        next reset (the memory pressure ends: SGLang's next iteration can
        admit and decode again); returns the tokens given back, 0 when none
        were held. Release before an accepted ``flush_cache``: a flush clears
        the allocator, held slots included, so giving them back after it
        would free them twice. Under pipeline parallelism every rank gives
        them back when the next iteration ingests (before a flush posted
        after this call)."""
        return self._kv_holds.release()

    @property
    def kv_pressure_pending(self) -> bool:
        """Under pipeline parallelism: whether an ``exhaust_kv``,
        ``evict_cache`` or ``release_exhausted_kv`` is queued for the ranks
        and not applied yet (the next iteration ingests it); always False
        off PP, where they apply at once."""
        return self._kv_holds.pending

    @property
    def exhausted_kv_tokens(self) -> int:
        """KV tokens ``exhaust_kv`` holds now (given back at the next reset);
        under pipeline parallelism, once what was asked of the ranks is done."""
        return self._kv_holds.promised_tokens

    # --- queries -------------------------------------------------------------
    def find_req_by_rid(self, rid: str) -> Optional[Any]:
        return state.find_req(self.scheduler, rid)

    def list_active_reqs(self) -> List[Any]:
        """Every unfinished request held anywhere (all PP slots, result_queue)."""
        return list(state.live_reqs(self.scheduler).values())

    def holders(self) -> List[state.Holder]:
        return state.holders(self.scheduler)

    def where_is(self, rid: str) -> List[str]:
        return state.where_is(self.scheduler, rid)

    def batch_composition(self) -> Dict[str, List[str]]:
        s = self.scheduler
        chunked = [s.chunked_req.rid] if getattr(s, "chunked_req", None) is not None else []
        prefill: List[str] = []
        decode: List[str] = []
        seen = set()
        for holder in state.holders(s):
            batch = holder.batch
            if batch is None or id(batch) in seen or holder.label.startswith("running"):
                continue
            seen.add(id(batch))
            mode = getattr(batch, "forward_mode", None)
            if mode is None:
                continue
            bucket = prefill if mode.is_extend() else decode if mode.is_decode() else None
            if bucket is not None:
                bucket.extend(r.rid for r in batch.reqs if r.rid not in bucket and r.rid not in chunked)
        running = [r.rid for r in getattr(s.running_batch, "reqs", [])] if s.running_batch is not None else []
        waiting = [r.rid for r in s.waiting_queue]
        return {"prefill": prefill, "decode": decode, "chunked": chunked,
                "running": running, "waiting": waiting}

    def engine_stats(self) -> Dict[str, int]:
        return state.engine_stats(self.scheduler)

    def hicache(self) -> Optional[Dict[str, Any]]:
        """HiCache's state, read-only (``hicache_state.view``): host pool free
        and size, the copy queues, ongoing backups and loads, the last batch's
        ``hicache_consumer_index``; None when HiCache is off."""
        return hicache_state.view(self.scheduler)

    def hold_hicache_transfers(self, *, loads: bool = True, backups: bool = False,
                               max_iterations: Optional[int] = None) -> None:
        """Hold HiCache's copies from now on (``hooks/hicache_gate.py``): a
        host->device load (``loads``) or device->host backup (``backups``)
        issued while held copies nothing and stays pending across iterations
        until ``release_hicache_transfers`` (or, with ``max_iterations``,
        that many iterations after it was issued: a slow copy); a forward
        that waits on a held load copies it first (as a GPU stream would).
        The reset between scripts releases everything. Needs HiCache on."""
        if hicache_state.controller(self.scheduler) is None:
            raise RuntimeError("hold_hicache_transfers: HiCache is off "
                               "(run with --sglang-arg enable_hierarchical_cache=true)")
        hicache_gate.gate().hold(loads=loads, backups=backups, max_iterations=max_iterations)

    def release_hicache_transfers(self, kind: Optional[str] = None) -> int:
        """Copy what the gate holds (of ``kind``: "load" or "backup"; all by
        default), make every pending completion visible to SGLang (reaped at
        its next poll) and stop holding that kind. Returns how many."""
        return hicache_gate.gate().release(kind)

    def hicache_transfers(self) -> List[Dict[str, Any]]:
        """The copies SGLang has not reaped yet: seq, kind, state (held,
        copied, released), tokens, and whether a forward waited on it."""
        return [t.describe() for t in hicache_gate.gate().transfers]

    def get_all_node_lock_refs(self) -> Dict[Any, int]:
        return radix.all_lock_refs(self.scheduler.tree_cache)

    def get_all_node_hit_counts(self) -> Dict[Any, int]:
        return radix.all_hit_counts(self.scheduler.tree_cache)

    def tree_node_count(self) -> int:
        return radix.node_count(self.scheduler.tree_cache)

    @property
    def is_fully_idle(self) -> bool:
        """The scheduler's own idle gate (what flush_cache trusts)."""
        return sglang_compat.is_fully_idle(self.scheduler)

    @property
    def requests_arriving(self) -> bool:
        """Whether a request posted to SGLang reached the scheduler's socket
        and is not taken in yet (the next iteration queues it)."""
        work = sglang_compat.work_request_type_names()
        return any(type(f).__name__ in work for f in self._inbox.pending())

    @property
    def nothing_held(self) -> bool:
        """The harness's complete scan: no request in any holder."""
        return state.nothing_held(self.scheduler)

    @property
    def pp_loop_size(self) -> int:
        """Iterations (microbatch slots) in one PP round; 1 outside PP."""
        return max(1, state.mbs_slots(self.scheduler))

    @property
    def is_paused(self) -> bool:
        return sglang_compat.is_paused(self.scheduler)

    def describe(self) -> str:
        return f"step={self.step} " + state.describe(self.scheduler)

    # --- waiting ---------------------------------------------------------------
    def wait_until(self, predicate: Callable[[], bool], *, max_steps: int = 200, what: str = "condition"):
        """``yield from ctx.wait_until(pred, max_steps=50, what="...")``."""
        return (yield from waits.wait_until(predicate, max_steps=max_steps, what=what, describe=self.describe))

    def wait_finished(self, *handles: ReqHandle, max_steps: int = 500):
        rids = ", ".join(h.rid for h in handles)
        return (yield from self.wait_until(
            lambda: all(h.finished for h in handles), max_steps=max_steps,
            what=f"requests [{rids}] to finish"))

    def wait_idle(self, *, max_steps: int = 500):
        """Until the scheduler's idle gate holds and nothing is held anywhere."""
        return (yield from self.wait_until(
            lambda: self.is_fully_idle and self.nothing_held, max_steps=max_steps,
            what="the scheduler to become idle"))

    # --- race windows ----------------------------------------------------------
    def window_open(self, name: str) -> Optional[str]:
        """The detail of window ``name`` if it is open now, else None."""
        windows.get(name)
        return self._observer.window_detail(name)

    def window_stats(self) -> Dict[str, Dict[str, int]]:
        """Per window: reached (times opened), open_steps, entered (so far this run)."""
        return self._observer.window_stats()

    def check_enabled(self, name: str) -> bool:
        """Whether check ``name`` (an invariant, contract or the output
        oracle's ``greedy_output``) runs in this script; False when the run
        switched it off (``--skip-invariant NAME``, ``--no-invariants``,
        ``server.run(..., invariants=...)``)."""
        return self._observer.check_enabled(name)

    def wait_for_window(self, name: str, *, max_steps: int = 200, required: bool = True):
        """``detail = yield from ctx.wait_for_window("finished_not_pruned")``:
        step until the named window is open; the script then has control inside
        it (inject now: the op is processed in the window's iteration). Raises
        WaitTimeout with the state seen if it does not open within max_steps;
        with ``required=False`` returns None instead."""
        window = windows.get(name)
        loop = self.loop_kind
        if loop not in window.loops:
            raise ValueError(
                f"window {name!r} ({window.source}) cannot open on the {loop} loop; "
                f"it applies to: {', '.join(window.loops)}")
        observer = self._observer
        for waited in range(max_steps + 1):
            detail = observer.window_detail(name)
            if detail is not None:
                observer.note_entered(name)
                return detail
            if waited == max_steps:
                break
            yield
        if not required:
            return None
        raise waits.WaitTimeout(
            f"window {name!r} ({window.source}) not reached within {max_steps} steps; "
            f"it is: {window.doc} State seen: {self.describe()}")

    def steps(self, n: int):
        """``yield from ctx.steps(n)``: run n iterations."""
        for _ in range(n):
            yield

