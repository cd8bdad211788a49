"""Runs one explored program on a live server and classifies the outcome
(harness process).

One server per topology is kept for the whole exploration; every run starts
with the driver's engine reset (abort all, wait for idle, flush). A crashed
or killed server is restarted before the next program.
"""
from __future__ import annotations

import dataclasses
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from scripted_runtime import extensions as extension_points, protocol
from scripted_runtime.user_side import scenario_history, templates
from scripted_runtime.user_side.explore import actions as A
from scripted_runtime.user_side.explore.determinism import RID
from scripted_runtime.user_side.result import ScriptResult, violation_signature
from scripted_runtime.user_side.server_config import ServerConfig
from scripted_runtime.user_side.standby import Standby

INTERPRETER = protocol.ScriptTarget(qualname="run_source", module="scripted_runtime.scheduler_side.explore.interpreter")
SETTLE = protocol.ScriptTarget(qualname="nothing", module="scripted_runtime.scheduler_side.explore.interpreter")
# Loads the served weights back when a weight update changed them (a passing program's
# interpreter does it itself; a failing one stops before it).
RESTORE_WEIGHTS = protocol.ScriptTarget(qualname="restore_served_weights",
                                        module="scripted_runtime.scheduler_side.output_oracle")
WARM_REFERENCES = protocol.ScriptTarget(qualname="warm", module="scripted_runtime.scheduler_side.output_oracle")
EXAMPLE_TIMEOUT_S = 120.0
STANDBY_MODES = ("auto", "on", "off")


def posted_ops(result: ScriptResult) -> Optional[Tuple[str, ...]]:
    """The control operations a script posted, by name (what a known bug's
    ``needs_ops`` reads); None for a crash whose report carried no control
    log (a process that died before its driver could send one)."""
    if not result.control_log_known:
        return None
    return tuple(str(op.get("op", "")) for op in result.control_log or ())


@dataclass
class Outcome:
    """What one program did. ``signature`` is None when it passed; equal
    signatures are treated as the same bug (and shrunk as one)."""

    signature: Optional[str]
    message: str = ""
    steps: int = 0
    reset_steps: int = 0
    run_s: float = 0.0  # in the scheduler: reset + script
    reset_s: float = 0.0
    io_s: float = 0.0  # HTTP posts and arrival waits of the script
    wall_s: float = 0.0  # in the harness, server.run round trip
    restart_s: float = 0.0  # restarting a dead server before this program
    windows: Dict[str, Dict[str, int]] = field(default_factory=dict)
    coverage: Dict[str, int] = field(default_factory=dict)
    outputs_compared: int = 0  # greedy requests the output oracle compared with their reference
    failing_action: Optional[int] = None  # index into the program; None: end checks or unknown
    failing_step: Optional[int] = None
    # where it ran: the server (its ``server_id``) and how many programs that server ran before it
    # (``ExampleRunner.history_before``)
    server_id: str = ""
    history_index: int = 0
    # the distinct abstract states it reached (``scheduler_side/abstract_state.py``): what novelty
    # guidance and the coverage figure count
    states: Tuple[str, ...] = ()
    # the control operations it posted, by name, in order (what a known bug's ``needs_ops``
    # reads); None when not known (a crash whose driver sent no control log)
    ops: Optional[Tuple[str, ...]] = ()
    # a program that failed and then left an engine whose reset killed the scheduler: its own
    # failure, (signature, message), before the crash became its signature
    own_failure: Optional[Tuple[str, str]] = None

    @property
    def failed(self) -> bool:
        return self.signature is not None


def _normalize(text: str, limit: int = 100) -> str:
    text = re.sub(r"0x[0-9a-f]+", "0x?", text)
    text = RID.sub("<rid>", text)
    text = re.sub(r"\d+", "N", text)
    return text.strip()[:limit]


def signature_of(result: ScriptResult) -> Optional[str]:
    """A failure's identity, stable across programs: invariant name, crash
    exception line, or error type and the first clause of its message."""
    if result.passed:
        return None
    if result.violation:
        return violation_signature(result.violation)
    error = (result.error or "").strip()
    if result.crashed:
        return "SchedulerCrashed: " + _normalize(error.partition(": ")[2])
    etype, _, msg = error.partition(": ")
    msg = re.split(r"[;(\[]", msg, maxsplit=1)[0]
    return f"{etype}: {_normalize(msg, 80)}" if msg else etype or "failed"


# How much of a failure's first line the known-bug registry sees. A mismatch of a session turn
# spends ~120 characters on saying so before its verdict; at 300 the oracle's closing words (what a
# non-final chunk's token is) were cut, and the registered chunk bug came back as a new finding (the
# pp4 dev exploration of 2026-11-29, program 619).
MESSAGE_CHARS = 1000


def first_line(error: Optional[str]) -> str:
    """A failure's message as the known-bug registry matches it: the first
    line of its error, at most ``MESSAGE_CHARS`` characters."""
    return (error or "").strip().splitlines()[0][:MESSAGE_CHARS] if error else ""


def _own_failure(result: ScriptResult) -> Optional[Tuple[str, str]]:
    """(signature, message) of the program's own failure where a crash in
    the reset after it became its failure (``ScriptResult.own_failure``)."""
    if result.own_failure is None:
        return None
    error, violation = result.own_failure
    own = ScriptResult(script=result.script, passed=False, error=error, violation=violation)
    return signature_of(own) or "failed", first_line(error)


def failing_position(result: ScriptResult, source: A.Source) -> Optional[int]:
    """The program line the script stood at when it failed, as an action index."""
    for filename, line, function in result.script_stack or []:
        if function == A.PROGRAM_FUNCTION:
            return source.action_at(line)
    return None


def _failing_step(result: ScriptResult) -> Optional[int]:
    if result.passed:
        return None
    if result.violation:
        return result.violation.get("step", result.steps)
    if result.crashed and not result.trace_path:
        return None  # a crash reports no step; only its trace would tell
    return result.steps


class ExampleRunner:
    """Runs programs on one topology's server; starts it lazily, restarts it
    after a crash. Pass ``server`` to reuse a running one (it is then not
    shut down by ``close``)."""

    def __init__(self, config: ServerConfig, *, log_dir: Optional[Path] = None,
                 server: Any = None, start_timeout_s: float = 300.0,
                 example_timeout_s: float = EXAMPLE_TIMEOUT_S, standby: str = "auto", progress=None) -> None:
        """``config``: the server's configuration (its ``checks`` are what
        every program is checked with). ``standby``: keep a second server
        ready to swap in when the live one dies (``standby.py``): ``auto``
        from the first restart on (a run that never crashes pays nothing)
        where servers are spawned, none where they fork from a template,
        ``on`` from the start, ``off``. Only for a server this runner owns."""
        if standby not in STANDBY_MODES:
            raise ValueError(f"standby must be one of {', '.join(STANDBY_MODES)}, got {standby!r}")
        if server is None and standby == "auto" and templates.enabled(config.device, os.environ):
            # a restart from a process template takes seconds (8 s at pp=4 on
            # the 2-core box, bench/README.md): a second server is not worth its memory
            standby = "off"
        self.standby_mode = standby if server is None else "off"
        self._standby: Optional[Standby] = None
        self.swaps = 0  # restarts served by the standby
        self.config = config
        self.topology = config.topology
        self.device = config.device
        self.log_dir = log_dir
        self.start_timeout_s = start_timeout_s
        self.example_timeout_s = example_timeout_s
        self.server = server
        self._own_server = server is None
        self._warmed = False  # the output oracle's references computed on this server
        self._warm_failed = False  # computing them failed on this build: not tried again after a restart
        self.warm_s = 0.0  # seconds the last reference warm-up took (after server ready, before programs)
        self.restarts = 0
        self.start_s: Optional[float] = None
        # What each server ran since it started, by ``server_id``: programs (action lists) and
        # scenario files ("PATH:FUNC"), each after the engine reset and followed by the settle probe.
        # The reference warm-up is not listed: every fresh server runs it before anything else.
        self.histories: Dict[str, List[Any]] = {}
        self.progress = progress or (lambda line: None)

    @property
    def invariants(self) -> Any:
        """What each program is checked with: the configuration's checks
        (the explorer may turn one off after the start, ``waive_known_checks``)."""
        return self.config.checks

    @property
    def oracle_on(self) -> bool:
        """Whether the output oracle is among the checks (else no references are needed)."""
        if self.invariants is True:
            return True
        return bool(self.invariants) and "greedy_output" in self.invariants

    @property
    def info(self) -> Dict[str, Any]:
        return self.server.info if self.server is not None else {}

    def ensure_server(self) -> float:
        """Start (or restart) the server if needed; returns seconds spent."""
        from scripted_runtime.user_side.server import ScriptedServer

        t0 = time.monotonic()
        if self.server is None:
            self.progress(f"starting the {self.topology} server ({self.device})...")
            self.server = ScriptedServer.start(self.config, start_timeout_s=self.start_timeout_s,
                                               log_dir=self.log_dir)
            self.start_s = time.monotonic() - t0
            self.progress(f"server ready in {self.start_s:.1f}s (sglang {self.info.get('sglang_version')}, "
                          f"loop {self.info.get('loop_kind')}, {self.server.origin})")
            line = extension_points.loaded_line(self.info)
            if line:
                self.progress(line)
            self._warm_references()
            if self.standby_mode == "on":
                self.start_standby()
            return self.start_s
        if not self.server.alive:
            self._restart("scheduler died")
            return time.monotonic() - t0
        if not self._warmed:
            self._warm_references()
        return 0.0

    @property
    def _needs_references(self) -> bool:
        """The output oracle is on and computing its references did not fail on this build."""
        return self.oracle_on and not self._warm_failed

    def _warm_references(self) -> None:
        """The output oracle's reference of every prompt a program can
        draw, computed once per server before any program: so no program
        computes one, and each runs the same steps whatever ran before it.
        It runs with the checks off (they judge programs, not this); on a
        build so broken that it fails (a mutant, a reverted fix), programs
        compute the references they need at their end instead."""
        self._warmed = True  # tried once per server, whatever the outcome
        if not self._needs_references:
            return
        t0 = time.monotonic()
        try:
            self._run_warm(t0)
        finally:
            self.warm_s = time.monotonic() - t0

    def _run_warm(self, t0: float) -> None:
        result = self._warm_on(self.server)
        if result.passed:
            counts = result.value or {}
            rejected = (" (the cache disagreed with a reference run here: not read on this server)"
                        if counts.get("cache_rejected") else "")
            self.progress(f"output oracle: {counts.get('references', 0)} reference outputs computed, "
                          f"{counts.get('from_cache', 0)} read from the reference cache{rejected}, in "
                          f"{time.monotonic() - t0:.1f}s")
            return
        first = (result.error or "").strip().splitlines()[0][:200] if result.error else "failed"
        self._warm_failed = True  # the same build fails the same way: a restart does not try again
        self.progress(f"output oracle: computing the references up front failed on this build ({first}); "
                      "programs compute the ones they need at their end")
        if not self.server.alive:
            self.restarts += 1
            self.progress(f"the scheduler died computing them; restarting the {self.topology} server "
                          f"(restart {self.restarts})")
            self.server.restart()

    def _warm_on(self, server: Any) -> ScriptResult:
        """Compute, on ``server``, the reference of every prompt a program can draw."""
        from scripted_runtime.scheduler_side.explore.prompts import prompt_ids
        from scripted_runtime.user_side.explore import strategies

        # every (family, length) a Start can draw; a Resend's longer prompt is one of them too
        prompts = [prompt_ids(family, n) for n in A.PROMPT_LENGTHS for family in strategies.PROMPT_FAMILIES]
        features = self.features()
        # a LoRA topology: every adapter's references of the prompts a request with one draws
        lora_prompts = ([prompt_ids(family, n) for n in A.LORA_PROMPT_LENGTHS for family in strategies.PROMPT_FAMILIES]
                        if "lora" in features else [])
        return server.run(WARM_REFERENCES, prompts, strategies.MAX_NEW_TOKENS, True, lora_prompts,
                          timeout=self.example_timeout_s * 4, trace=False, invariants=False)

    def _prepare_standby(self, server: Any) -> None:
        """In the standby's thread: what ``_warm_references`` does for the
        live server, so a swap costs no warm-up."""
        if not self._needs_references:
            return
        result = self._warm_on(server)
        if not result.passed:
            raise RuntimeError(f"the standby's reference warm-up failed: {result.error}")

    @property
    def standby(self) -> Optional[Standby]:
        """The standby server starting or ready now, if any."""
        return self._standby

    @property
    def owns_server(self) -> bool:
        return self._own_server

    def start_standby(self) -> None:
        """Start the standby (unless ``--standby off`` or a passed-in
        server): after a restart, so the next crash swaps too, and when a
        fresh server will be wanted soon (the found failure's fresh replay)."""
        if self._standby is None and self.standby_mode != "off" and self._own_server:
            self._standby = Standby(self.server, prepare=self._prepare_standby, progress=self.progress)

    def _restart(self, why: str) -> None:
        self.restarts += 1
        standby, self._standby = self._standby, None
        fresh = standby.take(timeout_s=self.start_timeout_s) if standby is not None else None
        if fresh is not None:
            self.swaps += 1
            self.progress(f"{why}; swapping in the standby {self.topology} server (restart {self.restarts}, "
                          f"swap {self.swaps})")
            self.server.shutdown()
            self.server = fresh
            self._warmed = True  # the standby was prepared as _warm_references would have
        else:
            self.progress(f"{why}; restarting the {self.topology} server (restart {self.restarts})")
            self.server.restart()
            self._warmed = False
        if not self._warmed:
            self._warm_references()
        self.start_standby()  # the next crash swaps too

    @property
    def history(self) -> List[Any]:
        """What the live server ran since it started (see ``histories``)."""
        return self.histories.setdefault(self._server_key(), []) if self.server is not None else []

    def features(self) -> Tuple[str, ...]:
        """The engine features of the server this runner runs programs on."""
        return (getattr(self, "config", None) or ServerConfig(self.topology)).features()

    def _server_key(self) -> str:
        """The live server's identity (a new one at each start and restart)."""
        return str(getattr(self.server, "server_id", None) or id(self.server))

    def history_before(self, outcome: "Outcome") -> List[Any]:
        """What ran on ``outcome``'s server before it, oldest first."""
        return list(self.histories.get(outcome.server_id, [])[:outcome.history_index])

    def _record(self, entry: Any) -> tuple:
        """Add ``entry`` to the history of the server it ran on (the live
        one: a dead server is replaced only before the next run); returns
        (server_id, its index there)."""
        history = self.history
        history.append(entry)
        return self._server_key(), len(history) - 1

    def fresh_server(self, why: str) -> None:
        """Make the live server a fresh one (nothing run on it since its
        start and warm-up), restarting or swapping in the standby if it ran
        anything. Only for a server this runner owns."""
        if not self._own_server:
            raise RuntimeError("fresh_server needs a server the runner owns (it was passed one)")
        self.ensure_server()
        if self.history:
            self._restart(why)

    def run(self, program: Sequence[A.Action], *, trace: Any = False) -> Outcome:
        restart_s = self.ensure_server()
        source = A.to_source(program)
        t0 = time.monotonic()
        result = self._settled(self._run_fresh_if_reset_failed(
            lambda: self.server.run(INTERPRETER, source.text, timeout=self.example_timeout_s,
                                    trace=trace, invariants=self.invariants, abstract_states=True)))
        wall = time.monotonic() - t0
        self._restore_after_failure(result)
        server_id, index = self._record(tuple(program))
        value = result.value if isinstance(result.value, dict) else {}
        return Outcome(
            signature=signature_of(result),
            message=first_line(result.error),
            steps=result.steps, reset_steps=result.reset_steps, run_s=result.duration_s,
            reset_s=result.reset_s, io_s=result.io_s, wall_s=wall, restart_s=restart_s,
            windows=result.windows or {}, coverage=value.get("coverage", {}),
            outputs_compared=int((value.get("end") or {}).get("outputs_compared", 0) or 0),
            failing_action=failing_position(result, source) if not result.passed else None,
            failing_step=_failing_step(result), server_id=server_id, history_index=index,
            states=tuple(result.states), ops=posted_ops(result),
            own_failure=_own_failure(result),
        )

    def run_file(self, path: str, *, trace: Any = False, function: str = A.PROGRAM_FUNCTION) -> ScriptResult:
        """Run scenario ``path:function`` as ``scripted-runtime run`` does:
        first the scripts its file lists to run before it (``RUNS_BEFORE``,
        a history the failure needs), each after the engine reset."""
        self.ensure_server()

        def run(spec: str, last: bool) -> ScriptResult:
            result = self._settled(self._run_fresh_if_reset_failed(
                lambda: self.server.run(spec, timeout=self.example_timeout_s, trace=trace if last else False,
                                        invariants=self.invariants)))
            self._record(spec)
            self._restore_after_failure(result)
            return result

        return scenario_history.run_in_order(path, function, run)

    def _restore_after_failure(self, result: ScriptResult) -> None:
        """After a failed script, load the served weights back (a failure
        can stop a program between its weight update and its own restore):
        the next program, the determinism check's second run among them,
        must start with the served weights, as on a fresh server, without
        steps of its own to load them (a written file's replay failed so
        and the program's run after it began with the restore's steps: a
        false "nondeterministic")."""
        if not result.passed and self.oracle_on and self.server is not None and self.server.alive:
            self.server.run(RESTORE_WEIGHTS, timeout=self.example_timeout_s, trace=False, invariants=False)

    def _settled(self, result: ScriptResult) -> ScriptResult:
        """A program must leave an engine the reset can restore: the reset is
        run right away (before an empty script), and if it dies or fails,
        that is this program's failure, not the next one's (which would
        otherwise be blamed, retried on a fresh server and pass there: the
        failure lost).

        After a program that failed without killing the scheduler (a check,
        a registered bug's symptom), the reset is probed too: when the
        scheduler dies in it, the crash is this program's failure (its
        signature; the program's own failure leads the traceback), judged
        with this program's operations and those the reset posted (its
        ``continue_generation`` and ``abort_all``), because what the program
        left behind killed SGLang when the reset drained it. A reset that fails there without a crash keeps the
        program's own failure, and a server this runner owns is restarted at
        once (every later reset would fail the same way)."""
        if not result.passed and (result.crashed or not self.server.alive):
            return result
        probe = self.server.run(SETTLE, timeout=self.example_timeout_s, trace=False, invariants=self.invariants)
        if probe.passed:
            return result
        if not result.passed:
            if not probe.crashed:
                if self._own_server and (probe.error or "").startswith("ResetError"):
                    # the engine cannot be reset (a wedged tokenizer, say): every later reset would
                    # wait for it again; start afresh now
                    # the failed program's error and what the reset found left (up to the state dump)
                    left = probe.error.partition("; state:")[0]
                    self._restart(f"the engine reset after a failed program ({(result.error or '')[:80]}) failed "
                                  f"({left[:400]})")
                return result
            self.progress(f"a program failed ({(result.error or '')[:80]}), then the scheduler died in the engine "
                          f"reset after it ({(probe.error or '')[:120]}): counted as that program's failure")
            return dataclasses.replace(
                result, error=probe.error, crashed=True, crashed_in_reset=False, violation=None,
                own_failure=(result.error, result.violation),
                # the crash is judged with the program's operations and the reset's that met it
                # (its abort_all of what the program left live: a known bug's needs_ops "abort");
                # the probe's log holds the reset's (and the program's ops it waited for)
                control_log=list(result.control_log or ()) + (list(probe.control_log or ())
                                                               if probe.control_log_known else []),
                traceback=("The program failed; then the scheduler died in the engine reset right after it, so "
                           "the program left an engine SGLang could not reset.\nThe program's own failure:\n"
                           + (result.error or "") + "\n" + (result.traceback or "")
                           + "\nThe crash in the reset:\n" + (probe.traceback or "")))
        self.progress(f"a program passed, then the engine reset after it failed ({(probe.error or '')[:120]}): "
                      "counted as that program's failure")
        return dataclasses.replace(
            result, passed=False, error=probe.error, crashed=probe.crashed, crashed_in_reset=False,
            script_stack=None,
            traceback=("The program passed; the engine reset right after it failed, so the program left an "
                       "engine the reset cannot restore:\n" + (probe.traceback or "")))

    def _run_fresh_if_reset_failed(self, run: Callable[[], ScriptResult]) -> ScriptResult:
        """``run()``, once more on a fresh server when the engine reset
        before it failed (a ResetError: the engine did not come back) or
        killed the scheduler (what the program before left behind, a leaked
        row say, tripped SGLang's own idle checks): neither is this
        program's doing."""
        result = run()
        if result.passed:
            return result
        if (result.error or "").startswith("ResetError"):
            self._restart(f"reset failed ({result.error[:120]}), so this program is retried")
            return run()
        if result.crashed_in_reset:
            self._restart(f"the scheduler died in the reset before this program ({(result.error or '')[:120]}): "
                          "the program before it left the engine broken; this one is retried")
            return run()
        return result

    def close(self) -> None:
        if self._standby is not None:
            self._standby.close()
            self._standby = None
        if self.server is not None and self._own_server:
            self.server.shutdown()
            self.server = None
