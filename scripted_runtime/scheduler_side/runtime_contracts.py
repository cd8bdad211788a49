"""Contracts of the runtime knobs, the weight queries and the sessions
(scheduler process):
``set_internal_state``, ``slow_down``, ``update_weight_version``,
``get_weights_by_name``, ``weights_checker`` (``check_weights``) and the
``server_info`` query. Each rule is read off SGLang 0.5.23
(``scheduler_components/internal_state.py``, ``Scheduler.slow_down``,
``Scheduler.record_weight_version_change``, ``weight_exporter.py``,
``utils/weight_checker.py``, ``get_num_allocatable_reqs``):

* ``runtime_limits``:
  - ``set_internal_state({"pp_max_micro_batch_size": k})`` answers
    ``updated=True`` exactly when ``1 <= k <= max_running_requests //
    pp_size`` (SGLang's validation), and afterwards admission reads ``k``
    (refused: the value before). Requests naming other keys are not judged
    (they need speculative decoding or a DSpark draft worker).
  - every prefill launched, from the engine's start, admits within the
    limit admission reads: an extend forward launched while the
    (micro)batch's running batch held ``r`` requests holds at most
    ``max(k - r, 0)`` requests, plus the continuing chunked request, which
    SGLang always lets through (``get_new_batch_prefill``: the chunked
    request is added first, then each waiting request only while
    ``len(can_run_list) < k - r``).
  - ``slow_down(t)`` leaves ``forward_sleep_time`` at ``t``, or unset for
    ``t <= 0`` / None.
* ``weight_queries``:
  - a query (``get_weights_by_name``, ``check_weights`` other than
    ``reset_tensors``, ``server_info``) changes no pool: tree, rows and KV
    as before it.
  - ``get_weights_by_name(name, n)`` answers the first ``n`` rows of the
    parameter as the last weight load put it there: the checkpoint file the
    server started from, or the one the last successful
    ``update_weights_from_disk`` named (compared where the file holds the
    name and the weights are not lost to a release or a ``reset_tensors``).
  - ``check_weights``: ``checksum`` gives equal checksums exactly when the
    harness's own digest of the weights (every parameter and buffer SGLang's
    checker does not skip) is equal; ``compare`` succeeds exactly when the
    digest equals the one at the last ``snapshot`` (and fails without a
    snapshot: SGLang asserts one inside its ``try``).
  - ``update_weight_version(v)`` leaves the served version label at ``v``.
* ``diagnostics``: ``configure_logging(log_level=L)`` leaves the
  scheduler's root logger at ``L``; ``start_profile`` answering success
  leaves a profile running (and is refused while one runs), one started
  with ``num_steps`` stops by itself once the forward count reaches its
  target (``_profile_batch_predicate``), ``stop_profile`` answering success
  leaves none running and a new trace file in the output directory; neither
  changes a pool.
* ``sessions``: ``open_session(id)`` answers success exactly when ``id``
  was not open (``SessionController.open``), and then it is open;
  ``close_session(id)`` of an open session closes it at once, or marks it
  to close when its unfinished request finishes (``SessionController._close``).

The dispatch rules are judged in the dispatcher (``RuntimeMemory``), the
admission rule once an iteration over the forwards launched (``check``).
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from scripted_runtime.hooks import sglang_compat
from scripted_runtime.scheduler_side import check_registry, contracts, memory_occupation
from scripted_runtime.scheduler_side.check_registry import Violation

NAMES = ("runtime_limits", "weight_queries", "sessions", "diagnostics")
DOCS = {
    "runtime_limits": "set_internal_state answers and applies SGLang's micro-batch limit; every prefill admits "
                      "within the limit; slow_down sets forward_sleep_time",
    "weight_queries": "weight and state queries change no pool; get_weights_by_name answers the loaded checkpoint; "
                      "check_weights checksums and compares agree with the weights; update_weight_version sets it",
    "sessions": "open_session succeeds exactly for an id not open and opens it; close_session closes it at once "
                "when no request of it is unfinished",
    "diagnostics": "configure_logging sets the scheduler's log level; a profile started runs, one started with "
                   "num_steps stops by itself at its target and writes its trace, stop_profile stops it; neither "
                   "changes a pool",
}

SET_STATE_TYPE = "SetInternalStateReq"
SLOW_DOWN_TYPE = "SlowDownReqInput"
VERSION_TYPE = "UpdateWeightVersionReqInput"
GET_WEIGHTS_TYPE = "GetWeightsByNameReqInput"
CHECK_WEIGHTS_TYPE = "CheckWeightsReqInput"
SERVER_INFO_TYPE = "GetInternalStateReq"
UPDATE_DISK_TYPE = "UpdateWeightFromDiskReqInput"
OPEN_SESSION_TYPE = "OpenSessionReqInput"
CLOSE_SESSION_TYPE = "CloseSessionReqInput"
LOGGING_TYPE = "ConfigureLoggingReq"
PROFILE_TYPE = "ProfileReq"
# forwards past a profile's target count before "it did not stop by itself": none. ``run_batch``
# counts the batch (``forward_ct += 1``) and then calls ``_profile_batch_predicate``, which stops
# the profile once ``target <= forward_ct``: after any batch that reached the target the profile
# is stopped (0.5.23 ``managers/scheduler.py``, ``scheduler_components/profiler_manager.py``)
PROFILE_STOP_SLACK = 0
# (what a weight update loaded is noted by ``after_dispatch`` for every script, a release's loss by
# ``memory_occupation``: neither needs the contracts' bookkeeping)
TYPES = frozenset({SET_STATE_TYPE, SLOW_DOWN_TYPE, VERSION_TYPE, GET_WEIGHTS_TYPE, CHECK_WEIGHTS_TYPE,
                   SERVER_INFO_TYPE, OPEN_SESSION_TYPE, CLOSE_SESSION_TYPE, LOGGING_TYPE, PROFILE_TYPE})
QUERY_TYPES = frozenset({GET_WEIGHTS_TYPE, CHECK_WEIGHTS_TYPE, SERVER_INFO_TYPE})
DIAGNOSTIC_TYPES = frozenset({LOGGING_TYPE, PROFILE_TYPE})

# Per rank (scheduler id), kept across scripts like the weights themselves: the checkpoint
# the served weights were last loaded from (None: unknown, random after a reset_tensors), and
# the harness's digest of the weights when SGLang's checker took its snapshot (a snapshot
# outlives the script that took it; a failed compare keeps it).
_loaded_from: Dict[int, Optional[str]] = {}
_snapshot_digest: Dict[int, Optional[str]] = {}


def weights_digest(s: Any) -> Optional[str]:
    """The harness's own digest of the weights SGLang's checker looks at:
    every parameter and buffer of this rank's model that
    ``weight_checker._is_skip_weight_check`` does not skip, bytes and all."""
    model = sglang_compat.served_model(s)
    if model is None:
        return None
    import torch

    h = hashlib.sha256()
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if sglang_compat.weight_check_skips(name, t):
            continue
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def loaded_from(s: Any) -> Optional[str]:
    """The checkpoint this rank's weights were last loaded from."""
    key = id(s)
    if key not in _loaded_from:
        _loaded_from[key] = getattr(getattr(s, "server_args", None), "model_path", None)
    return _loaded_from[key]


def checkpoint_files(path: str) -> List[str]:
    """The safetensors files of the checkpoint at ``path``: the file itself,
    or a directory's, sorted (none when it is neither)."""
    if path.endswith(".safetensors"):
        return [path]
    if not os.path.isdir(path):
        return []
    return sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))


def checkpoint_tensor(path: Optional[str], name: str) -> Any:
    """Tensor ``name`` of the safetensors checkpoint at ``path`` (a file or a
    directory of them), or None when it is not there."""
    if not path:
        return None
    from safetensors import safe_open

    for f in checkpoint_files(path):
        with safe_open(f, framework="pt") as handle:
            if name in handle.keys():
                return handle.get_tensor(name)
    return None


@dataclass
class RuntimeMemory:
    """What the two contracts remember across the iterations of one run."""

    TYPES = TYPES
    problems: List[Tuple[str, str]] = field(default_factory=list)  # (contract, message), found at dispatch
    harness_error: Optional[str] = None
    batch_cursor: int = 0
    last_chunked: Optional[str] = None  # the chunked rid the last extend launch left
    served_limit: Optional[int] = None  # the limit admission reads (refreshed at every set)
    # digest of the weights -> the checksum SGLang's checker answered for them (this script's: a
    # failure must replay on a fresh server from the script alone)
    checksums: Dict[str, str] = field(default_factory=dict)
    # the forward count at which a profile started with num_steps must have stopped (SGLang's rule:
    # the forward count at the start + num_steps + 1), None when none was started so
    profile_stop_at: Optional[int] = None

    def profile_overdue(self, profile: Dict[str, Any]) -> Optional[str]:
        """The message when a running profile (``profiler_state``) started
        with ``num_steps`` is past the target its start implied, and then
        forgets that target (one report per profile); else None."""
        target = self.profile_stop_at
        if target is None or profile["forward_ct"] < target + PROFILE_STOP_SLACK:
            return None
        self.profile_stop_at = None
        return (f"the profile started with num_steps should have stopped at forward {target}; the scheduler "
                f"ran {profile['forward_ct']} forwards and it still runs")

    def before_dispatch(self, s: Any, recv_req: Any) -> Any:
        kind = type(recv_req).__name__
        before: Dict[str, Any] = {}
        if kind in QUERY_TYPES or kind in DIAGNOSTIC_TYPES:
            before["pools"] = contracts.pools(s)
        if kind == PROFILE_TYPE:
            before["profile"] = sglang_compat.profiler_state(s)
            before["traces"] = _trace_files(before["profile"]["output_dir"])
        if kind == SET_STATE_TYPE:
            before["limit"] = sglang_compat.micro_batch_limit(s)
        if kind in (OPEN_SESSION_TYPE, CLOSE_SESSION_TYPE):
            before["open"] = sglang_compat.open_sessions(s)
            before["unfinished"] = sglang_compat.session_has_unfinished_request(s, getattr(recv_req, "session_id",
                                                                                           None))
        if kind == GET_WEIGHTS_TYPE:
            before["loaded_from"] = None if memory_occupation.weights_lost(s) else loaded_from(s)
        if kind == CHECK_WEIGHTS_TYPE and getattr(recv_req, "action", "checksum") in ("checksum", "snapshot",
                                                                                      "compare"):
            before["digest"] = weights_digest(s)
            before["snapshot_held"] = sglang_compat.weight_checker_snapshot(s)
        return before

    def on_dispatch(self, s: Any, recv_req: Any, output: Any, step: int, before: Any) -> None:
        kind = type(recv_req).__name__
        if kind in QUERY_TYPES and not (kind == CHECK_WEIGHTS_TYPE
                                        and getattr(recv_req, "action", "") == "reset_tensors"):
            changed = contracts.pools_changed(before["pools"], contracts.pools(s))
            if changed:
                self.problems.append(("weight_queries", f"the query {kind} changed the pools: {', '.join(changed)}"))
        if kind in DIAGNOSTIC_TYPES:
            changed = contracts.pools_changed(before["pools"], contracts.pools(s))
            if changed:
                self.problems.append(("diagnostics", f"{kind} changed the pools: {', '.join(changed)}"))
            self._on_diagnostic(s, recv_req, output, before)
        if kind == SET_STATE_TYPE:
            self._on_set(s, recv_req, output, before)
        elif kind == SLOW_DOWN_TYPE:
            t = getattr(recv_req, "forward_sleep_time", None)
            want = t if t is not None and t > 0 else None
            got = sglang_compat.forward_sleep_time(s)
            if got != want:
                self.problems.append(("runtime_limits", f"slow_down({t}) left forward_sleep_time at {got!r}, "
                                                        f"not {want!r}"))
        elif kind == VERSION_TYPE:
            want = getattr(recv_req, "new_version", None)
            got = sglang_compat.served_weight_version()
            if want is not None and got != want:
                self.problems.append(("weight_queries", f"update_weight_version({want!r}) left the served "
                                                        f"version at {got!r}"))
        elif kind == GET_WEIGHTS_TYPE:
            self._on_get_weights(s, recv_req, output, before)
        elif kind == CHECK_WEIGHTS_TYPE:
            self._on_check_weights(s, recv_req, output, before)
        elif kind in (OPEN_SESSION_TYPE, CLOSE_SESSION_TYPE):
            self._on_session(s, recv_req, output, before, opening=kind == OPEN_SESSION_TYPE)

    def _on_set(self, s: Any, recv_req: Any, output: Any, before: Dict[str, Any]) -> None:
        args = dict(getattr(recv_req, "server_args", None) or {})
        updated = getattr(output, "updated", None)
        now = sglang_compat.micro_batch_limit(s)
        self.served_limit = now
        if set(args) != {sglang_compat.MICRO_BATCH_KNOB} or updated is None:
            return
        value = args[sglang_compat.MICRO_BATCH_KNOB]
        lo, hi = sglang_compat.micro_batch_limit_range(s)
        valid = isinstance(value, int) and lo <= value <= hi
        what = f"set_internal_state({sglang_compat.MICRO_BATCH_KNOB}={value!r})"
        if bool(updated) != valid:
            self.problems.append(("runtime_limits", f"{what} answered updated={updated}, though the value is "
                                                    f"{'within' if valid else 'outside'} SGLang's range [{lo}, {hi}]"))
        elif valid and now != value:
            self.problems.append(("runtime_limits", f"{what} was accepted, yet admission reads {now}"))
        elif not valid and now != before.get("limit"):
            self.problems.append(("runtime_limits", f"{what} was refused, yet the limit moved from "
                                                    f"{before.get('limit')} to {now}"))

    def _on_session(self, s: Any, recv_req: Any, output: Any, before: Dict[str, Any], *, opening: bool) -> None:
        sid = getattr(recv_req, "session_id", None)
        now = sglang_compat.open_sessions(s)
        was_open = sid in before["open"]
        if opening:
            success = getattr(output, "success", None)
            if success is None:
                return  # not this rank's answer (SGLang answers on the first rank only)
            if bool(success) != (sid is not None and not was_open):
                self.problems.append(("sessions", f"open_session({sid!r}) answered success={success}, though the id "
                                                  f"was {'open' if was_open else 'not open'}"))
            elif sid is not None and sid not in now:
                self.problems.append(("sessions", f"open_session({sid!r}) answered success, yet no such session is "
                                                  "open"))
        elif was_open and sid in now and not before["unfinished"]:
            self.problems.append(("sessions", f"close_session({sid!r}) left the session open, though no request of "
                                              "it is unfinished (SGLang closes such a session at once)"))
        elif was_open and sid in now and not sglang_compat.session_closing(s, sid):
            self.problems.append(("sessions", f"close_session({sid!r}) left the session open, not marked to close "
                                              "when its unfinished request finishes"))

    def _on_get_weights(self, s: Any, recv_req: Any, output: Any, before: Dict[str, Any]) -> None:
        answer = getattr(output, "parameter", None)
        path = before.get("loaded_from")
        if answer is None or path is None:
            return
        name, n = recv_req.name, int(getattr(recv_req, "truncate_size", 100))
        expected = checkpoint_tensor(path, name)
        if expected is None:
            return
        import torch

        params = dict(sglang_compat.served_model(s).named_parameters())
        dtype = params[name].dtype if name in params else expected.dtype
        want = expected.to(dtype).to(torch.float32)[:n]
        got = torch.tensor(answer, dtype=torch.float32)
        if got.shape != want.shape or not torch.equal(got, want):
            diff = "shape " + str(tuple(got.shape)) if got.shape != want.shape else (
                f"max difference {float((got - want).abs().max()):.3g}")
            self.problems.append(("weight_queries", f"get_weights_by_name({name!r}, {n}) answered values that are "
                                                    f"not the checkpoint's it was loaded from ({path}): {diff}"))

    def _on_diagnostic(self, s: Any, recv_req: Any, output: Any, before: Dict[str, Any]) -> None:
        if type(recv_req).__name__ == LOGGING_TYPE:
            level = getattr(recv_req, "log_level", None)
            got = sglang_compat.root_log_level()
            if level is not None and got != str(level).upper():
                self.problems.append(("diagnostics", f"configure_logging(log_level={level!r}) left the scheduler's "
                                                     f"log level at {got}"))
            return
        after = sglang_compat.profiler_state(s)
        success = bool(getattr(output, "success", False))
        start = str(getattr(getattr(recv_req, "req_type", None), "name", "")).startswith("START")
        # a profile still running past the target its num_steps start implied: it should have stopped
        # before this request came, so that is the fault to name (the start's answer is judged
        # against a state SGLang should not have been in)
        overdue = self.profile_overdue(before["profile"]) if before["profile"]["in_progress"] else None
        if overdue:
            self.problems.append(("diagnostics", f"{overdue} (when a {'start' if start else 'stop'}_profile came)"))
            return
        if start and success and not getattr(recv_req, "start_step", None):
            steps = getattr(recv_req, "num_steps", None)
            self.profile_stop_at = before["profile"]["forward_ct"] + steps + 1 if steps else None
        if not start and success:
            self.profile_stop_at = None
        if start and success and not getattr(recv_req, "start_step", None) and not after["in_progress"]:
            self.problems.append(("diagnostics", "start_profile answered success, yet no profile runs"))
        elif start and success and before["profile"]["in_progress"]:
            self.problems.append(("diagnostics", "start_profile answered success while a profile was running "
                                                 "(SGLang refuses that)"))
        elif not start and success:
            if after["in_progress"]:
                self.problems.append(("diagnostics", "stop_profile answered success, yet the profile still runs"))
            elif len(_trace_files(before["profile"]["output_dir"])) <= len(before["traces"]):
                self.problems.append(("diagnostics", "stop_profile answered success, yet it wrote no trace in "
                                                     f"{before['profile']['output_dir']}"))
        elif not start and not success and before["profile"]["in_progress"]:
            self.problems.append(("diagnostics", "stop_profile of a running profile was refused: "
                                                 f"{getattr(output, 'message', '')!r}"))

    def _on_check_weights(self, s: Any, recv_req: Any, output: Any, before: Dict[str, Any]) -> None:
        action = getattr(recv_req, "action", "checksum")
        key = id(s)
        success = bool(getattr(output, "success", False))
        if action == "reset_tensors":
            return
        digest = before.get("digest")
        if digest is None:
            return
        if action == "snapshot":
            if success:
                _snapshot_digest[key] = digest
        elif action == "compare":
            held = before.get("snapshot_held")
            taken = _snapshot_digest.get(key)
            if held is False:
                if success:
                    self.problems.append(("weight_queries", "check_weights(compare) succeeded with no snapshot "
                                                            "taken"))
            elif held and taken is not None:
                if success != (taken == digest):
                    self.problems.append(("weight_queries", f"check_weights(compare) answered success={success}, yet "
                                                            f"the weights {'equal' if taken == digest else 'differ from'}"
                                                            " those at the snapshot"))
                if success:
                    _snapshot_digest[key] = None
        elif action == "checksum" and success:
            payload = getattr(output, "payload", None) or []
            checksum = getattr(payload[0], "per_gpu_checksum", None) if payload else None
            if checksum is None:
                return
            seen = self.checksums
            if digest in seen and seen[digest] != checksum:
                self.problems.append(("weight_queries", "check_weights(checksum) answered another checksum for "
                                                        "weights that did not change"))
            else:
                other = [d for d, c in seen.items() if c == checksum and d != digest]
                if other:
                    self.problems.append(("weight_queries", "check_weights(checksum) answered the same checksum "
                                                            "for different weights"))
            seen[digest] = checksum


def _trace_files(directory: Any) -> List[str]:
    """The profiler's trace files in ``directory`` (none when it is unset or missing)."""
    if not directory or not os.path.isdir(str(directory)):
        return []
    return sorted(f for f in os.listdir(str(directory)) if ".trace" in f)


def check_profile_stopped(s: Any, mem: "RuntimeMemory") -> Optional[str]:
    """A profile started with ``num_steps`` must stop by itself once the
    forward count reached the target its start implies (the count then +
    num_steps + 1, SGLang's ``_init_profile``; the batch that reaches it
    stops it, ``PROFILE_STOP_SLACK``); the message when it did not."""
    p = sglang_compat.profiler_state(s)
    if not p["in_progress"]:
        mem.profile_stop_at = None
        return None
    return mem.profile_overdue(p)


def after_dispatch(s: Any, recv_req: Any, output: Any) -> None:
    """Called by the driver's dispatcher after SGLang handled ``recv_req``,
    whether or not the contracts run (the explorer's own weight restores
    included): note what the weights were loaded from."""
    kind = type(recv_req).__name__
    if kind == UPDATE_DISK_TYPE and getattr(output, "success", False):
        _loaded_from[id(s)] = getattr(recv_req, "model_path", None)
    elif kind in contracts.SESSION_UPDATE_TYPES and getattr(output, "success", False):
        _loaded_from[id(s)] = None  # tensors from anywhere: no checkpoint file to compare against
    elif (kind == CHECK_WEIGHTS_TYPE and getattr(recv_req, "action", "") == "reset_tensors"
          and getattr(output, "success", False)):
        _loaded_from[id(s)] = None  # random weights: no checkpoint holds them


def forget(scheduler: Optional[Any] = None) -> None:
    """Drop what is known across scripts (a rank's, or all: tests)."""
    for table in (_loaded_from, _snapshot_digest):
        if scheduler is None:
            table.clear()
        else:
            table.pop(id(scheduler), None)


@check_registry.contract(*NAMES, docs=DOCS)
def check(view: Any, memory: Any) -> Optional[Violation]:
    """The first broken rule, of the contracts ``memory.step_inputs.enabled``."""
    mem: RuntimeMemory = memory.runtime
    inputs = memory.step_inputs
    enabled = inputs.enabled
    if mem.harness_error:
        error, mem.harness_error = mem.harness_error, None
        raise RuntimeError(f"the runtime contracts' bookkeeping failed at a dispatch: {error}")
    while mem.problems:
        contract, message = mem.problems.pop(0)
        if enabled(contract):
            mem.problems.clear()
            return Violation(contract, message, {})
    if enabled("diagnostics"):
        stuck = check_profile_stopped(view.s, mem)
        if stuck:
            return Violation("diagnostics", stuck, {})
    launched = inputs.launched_since(mem)
    if not launched or not enabled("runtime_limits"):
        for b in launched:
            if b.mode == "extend":
                mem.last_chunked = b.chunked_rid
        return None
    for b in launched:
        if b.mode != "extend":
            continue
        continuing = mem.last_chunked is not None and mem.last_chunked in b.rids
        mem.last_chunked = b.chunked_rid
        if b.running < 0:
            continue
        if mem.served_limit is None:
            mem.served_limit = sglang_compat.micro_batch_limit(view.s)
        limit = mem.served_limit
        if limit is None:
            continue
        allowed = max(limit - b.running, 0) + (1 if continuing and limit - b.running < 1 else 0)
        # priority preemption swaps: each request it sent back frees a slot for the one it admits, one for
        # one, also in a batch already past a limit lowered at run time (preempt_to_schedule takes victims
        # by tokens and does not count slots again; BatchRecord.preempted)
        allowed += len(b.preempted())
        if len(b.rids) > allowed:
            return Violation("runtime_limits",
                             f"a prefill launched at step {b.step}" + (f" (PP slot {b.slot})" if b.slot is not None
                                                                       else "")
                             + f" holds {len(b.rids)} requests [{', '.join(b.rids[:6])}] while the running batch "
                             f"held {b.running}: the micro-batch limit {limit} admits at most {allowed}"
                             + (" (the continuing chunk included)" if continuing else ""),
                             view.owner_info([r for r in view.reqs if r.rid in b.rids]))
    return None
