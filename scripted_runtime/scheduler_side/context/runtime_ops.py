"""The runtime knobs and weight queries a script can post (part of ``ctx``):
``set_internal_state``, ``slow_down``, ``freeze_gc``, ``update_weight_version``,
``get_weights_by_name``, ``check_weights``, the ``server_info`` query, and the
diagnostics ``configure_logging``, ``start_profile`` and ``stop_profile``.

Each posts SGLang's own HTTP route and returns a ``ControlOp`` once the
request reached the scheduler's socket (processed in the next iteration;
``op.answer`` is the scheduler's reply). What each does, its preconditions
and its contract: docs/control-requests.md, docs/checks.md
(``runtime_limits``, ``weight_queries``).
"""
from __future__ import annotations

import os
import tempfile
from typing import Any, Dict, Optional

from scripted_runtime.hooks import sglang_compat
from scripted_runtime.protocol import ENV_CRASH_DIR
from scripted_runtime.scheduler_side.control import ControlOp

CHECK_WEIGHTS_ACTIONS = ("checksum", "snapshot", "compare", "reset_tensors")


def profile_dir() -> str:
    """Where ``ctx.start_profile`` writes by default: ``profiles/`` in the
    server's work directory (beside the crash reports; the user's own files
    are never written to)."""
    crash_dir = os.environ.get(ENV_CRASH_DIR)
    base = os.path.dirname(crash_dir.rstrip("/")) if crash_dir else tempfile.gettempdir()
    return os.path.join(base, "profiles")
OPEN_ANSWER_TIMEOUT_S = 10.0  # the tokenizer answers an open the scheduler processed without further iterations


class RuntimeOps:
    """Mixed into ``ScriptContext`` (which provides ``_control``,
    ``unsettled_ops_of_type``, ``released_memory`` and ``_scheduler``).

    SGLang's tokenizer sends each of these through a communicator that waits
    for the scheduler's answer before it sends the next of the same kind, so
    a second one posted before the first was processed could not reach the
    frozen scheduler: that raises at once (yield first; the explorer's
    helpers step until it was processed)."""

    def _runtime_op(self, name: str, path: str, payload: Optional[dict], request_type: str,
                    method: str = "POST") -> ControlOp:
        pending = self.unsettled_ops_of_type(request_type)
        if pending:
            raise RuntimeError(
                f"{name}: {pending[0].name} posted at step {pending[0].posted_step} has not been processed yet, and "
                f"SGLang's tokenizer sends one {request_type} at a time (it waits for each answer), so this one "
                "could not reach the scheduler; yield (or `yield from op.wait()`) first")
        return self._control(name, path, payload, request_type, method=method)

    def set_internal_state(self, **server_args: Any) -> ControlOp:
        """POST ``/set_internal_state {"server_args": {...}}``. On the CPU
        default the key that applies is ``pp_max_micro_batch_size`` (the
        requests one (micro)batch may hold; also at pp 1): SGLang accepts
        ``1 <= k <= max_running_requests // pp_size`` and answers
        ``op.answer.updated``. The harness's reset puts the limit back."""
        if not server_args:
            raise ValueError("set_internal_state needs at least one key, e.g. "
                             f"set_internal_state({sglang_compat.MICRO_BATCH_KNOB}=2)")
        return self._runtime_op(f"set_internal_state({', '.join(f'{k}={v!r}' for k, v in server_args.items())})",
                             "/set_internal_state", {"server_args": dict(server_args)}, "SetInternalStateReq")

    @property
    def micro_batch_limit(self) -> Optional[int]:
        """The requests one (micro)batch may hold, as admission reads it now."""
        return sglang_compat.micro_batch_limit(self._scheduler)

    @property
    def micro_batch_limit_range(self) -> tuple:
        """(lowest, highest) value ``set_internal_state`` accepts for the limit."""
        return sglang_compat.micro_batch_limit_range(self._scheduler)

    def slow_down(self, forward_sleep_time: Optional[float]) -> ControlOp:
        """POST ``/slow_down``: every forward sleeps ``forward_sleep_time``
        seconds first (None or <= 0: no more). Iterations stay the unit of a
        script; only their wall-clock time grows. The reset clears it."""
        return self._runtime_op(f"slow_down({forward_sleep_time!r})", "/slow_down",
                             {"forward_sleep_time": forward_sleep_time}, "SlowDownReqInput")

    def freeze_gc(self) -> ControlOp:
        """POST ``/freeze_gc``: the scheduler (and the detokenizer, and the
        tokenizer) move every tracked object to the GC's permanent
        generation. Nothing the scheduler decides depends on it; not undone
        by the reset (SGLang has no route to unfreeze)."""
        return self._control("freeze_gc", "/freeze_gc", None, "FreezeGCReq")

    def configure_logging(self, log_level: str) -> ControlOp:
        """POST ``/configure_logging {"log_level": L}``: the tokenizer, the
        scheduler and the detokenizer set their root logger's level (the
        tokenizer checks the name first: a bad one is answered there and
        never reaches the scheduler). The reset puts the level back."""
        return self._runtime_op(f"configure_logging({log_level!r})", "/configure_logging",
                                {"log_level": log_level}, "ConfigureLoggingReq")

    @property
    def log_level(self) -> str:
        """The scheduler's root logger level name now."""
        return sglang_compat.root_log_level()

    def start_profile(self, *, num_steps: Optional[int] = None, output_dir: Optional[str] = None) -> ControlOp:
        """POST ``/start_profile``: the torch profiler with CPU activities
        (no stacks, no shapes: the trace of the tiny model stays small),
        writing into ``output_dir`` (default: ``profiles/`` in the server's
        work directory). With ``num_steps`` it stops by itself after that
        many forwards and writes its trace. SGLang refuses a start while a
        profile runs. The reset stops a profile a script left running."""
        payload = {"output_dir": output_dir or profile_dir(), "activities": ["CPU"], "with_stack": False,
                   "record_shapes": False}
        if num_steps:
            payload["num_steps"] = int(num_steps)
        return self._runtime_op(f"start_profile(num_steps={num_steps!r})", "/start_profile", payload, "ProfileReq")

    def stop_profile(self) -> ControlOp:
        """POST ``/stop_profile``: the profiler stops and writes its trace
        (SGLang refuses one when no profile runs)."""
        return self._runtime_op("stop_profile", "/stop_profile", None, "ProfileReq")

    @property
    def profiling(self) -> bool:
        """Whether the torch profiler runs on this rank."""
        return sglang_compat.profiler_state(self._scheduler)["in_progress"]

    def update_weight_version(self, version: str) -> ControlOp:
        """POST ``/update_weight_version`` (``abort_all_requests=False``: the
        route's default aborts every request first). Labels the served
        weights; live requests record the change. The reset puts it back."""
        return self._runtime_op(f"update_weight_version({version!r})", "/update_weight_version",
                             {"new_version": version, "abort_all_requests": False}, "UpdateWeightVersionReqInput")

    @property
    def weight_version(self) -> Optional[str]:
        return sglang_compat.served_weight_version()

    def get_weights_by_name(self, name: str, truncate_size: int = 100) -> ControlOp:
        """POST ``/get_weights_by_name``: the first ``truncate_size`` rows of
        parameter ``name`` (``op.answer.parameter``). Refused while the
        weights are released (on a GPU their pages are unmapped)."""
        self._refuse_weight_read("get_weights_by_name")
        return self._runtime_op(f"get_weights_by_name({name!r})", "/get_weights_by_name",
                             {"name": name, "truncate_size": truncate_size}, "GetWeightsByNameReqInput")

    def check_weights(self, action: str = "checksum") -> ControlOp:
        """POST ``/weights_checker {"action": ...}``: ``checksum`` (per rank,
        ``op.answer.payload``), ``snapshot`` (a copy of the weights, kept by
        SGLang until a successful ``compare``), ``compare`` (success exactly
        when the weights equal the snapshot's; CUDA only, refused elsewhere
        with the reason), ``reset_tensors`` (overwrite
        every weight with random values: the weights are lost until an update
        loads them). Refused while the weights are released."""
        if action not in CHECK_WEIGHTS_ACTIONS:
            raise ValueError(f"check_weights action must be one of {', '.join(CHECK_WEIGHTS_ACTIONS)}, got {action!r} "
                             "(SGLang raises on another and answers success=False)")
        self._refuse_weight_read(f"check_weights({action})")
        device = sglang_compat.model_device_type(self._scheduler)
        if action in sglang_compat.CHECK_WEIGHTS_CUDA_ONLY and device not in (None, "cuda"):
            raise RuntimeError(
                f"check_weights({action}) runs only on a CUDA device: SGLang's comparator moves every tensor with "
                f".cuda() (utils/weight_checker_comparator.py), so on this {device} server it answers success=False "
                "whatever the weights; compare checksums instead (ctx.check_weights('checksum'))")
        return self._runtime_op(f"check_weights({action})", "/weights_checker", {"action": action},
                             "CheckWeightsReqInput")

    def server_info(self) -> ControlOp:
        """GET ``/server_info``: the scheduler's internal state (a pure query)."""
        return self._runtime_op("server_info", "/server_info", None, "GetInternalStateReq", method="GET")

    def weight_snapshot_held(self) -> Optional[bool]:
        """Whether SGLang's weight checker holds a snapshot on this rank."""
        return sglang_compat.weight_checker_snapshot(self._scheduler)

    def _refuse_weight_read(self, what: str) -> None:
        if "weights" in self.released_memory:
            raise RuntimeError(
                f"{what}: the weights memory is released (release_memory_occupation); on a GPU with the memory "
                "saver its pages are unmapped and reading them faults. Resume it first: "
                "ctx.resume_memory_occupation(['weights'])")


def answer_fields(op: ControlOp) -> Dict[str, Any]:
    """The scheduler's reply of ``op`` as a dict (for a scenario's return value)."""
    answer = op.answer
    if answer is None:
        return {}
    return {k: getattr(answer, k) for k in getattr(answer, "__struct_fields__", ()) if hasattr(answer, k)}


class SessionOps:
    """Sessions (part of ``ctx``; mixed into ``ScriptContext``): open and
    close SGLang sessions. Requests that continue a session are not
    scripted yet (the output oracle would need the session's accumulated
    context as their prompt)."""

    def open_session(self, session_id: str, *, capacity_of_str_len: int = 1024) -> ControlOp:
        """POST ``/open_session``: SGLang opens ``session_id`` unless it is
        open already (``op.answer.success``). The reset closes what a script
        left open.

        SGLang's tokenizer refuses, without asking the scheduler, an id it
        is still opening (its future is dropped only after the answer), so an
        earlier open of this id is waited for first: its HTTP answer (a wall
        clock wait, bounded) once the scheduler processed it; not processed
        yet raises (yield first)."""
        for earlier in self.control_ops:
            if earlier.name != f"open_session({session_id!r})" or earlier.http.done:
                continue
            if not earlier.processed:
                raise RuntimeError(
                    f"open_session({session_id!r}): the open of this id posted at step {earlier.posted_step} has not "
                    "been processed yet, and SGLang's tokenizer refuses an id it is still opening without asking the "
                    "scheduler; yield (or `yield from op.wait()`) first")
            if not earlier.http.wait(OPEN_ANSWER_TIMEOUT_S):
                raise RuntimeError(f"open_session({session_id!r}): the earlier open of this id was processed at step "
                                   f"{earlier.processed_step} but not answered over HTTP within "
                                   f"{OPEN_ANSWER_TIMEOUT_S:.0f}s")
        return self._control(f"open_session({session_id!r})", "/open_session",
                             {"session_id": session_id, "capacity_of_str_len": capacity_of_str_len},
                             "OpenSessionReqInput")

    def close_session(self, session_id: str) -> ControlOp:
        """POST ``/close_session``: SGLang closes ``session_id`` (at once when
        no request of it is unfinished; an unknown id is a warning only)."""
        return self._control(f"close_session({session_id!r})", "/close_session", {"session_id": session_id},
                             "CloseSessionReqInput")

    @property
    def open_sessions(self) -> tuple:
        """The ids of the sessions open on this rank, sorted."""
        return sglang_compat.open_sessions(self._scheduler)
