"""One exploration on one topology: start (or reuse) the server, search,
write a failure out as a scenario, check that the file replays it and that
the program replays deterministically, print the statistics."""
from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from hypothesis import configuration as hypothesis_configuration

from scripted_runtime import known_bugs as known_bugs_mod
from scripted_runtime.user_side.explore import actions as A, determinism, failure_db, history as history_mod
from scripted_runtime.user_side.explore import search as search_mod, writer
from scripted_runtime.user_side.explore.explore_settings import FOUND_BY, ExploreSettings
from scripted_runtime.user_side.explore.runner import ExampleRunner, signature_of
from scripted_runtime.user_side.explore.stats import Stats
from scripted_runtime.user_side.server_config import ServerConfig

DEFAULT_OUT = "explore-found"


@dataclass
class ExploreReport:
    stats: Stats
    seed: Optional[int] = None
    signature: Optional[str] = None
    scenario_path: Optional[str] = None
    replay_verdict: Optional[str] = None  # the written file, run on a fresh server (else the explorer's)
    replay_matches: Optional[bool] = None
    replayed_fresh: bool = False  # the replay above ran on a fresh server (the explorer owned its server)
    # the failure needs earlier programs on its server (history.recover): its verdict, and the
    # file that runs them first (then ``scenario_path``); the first written file is ``standalone_path``
    history_verdict: Optional[str] = None
    standalone_path: Optional[str] = None
    # the failure needs no history, but the file Hypothesis shrank on the explorer's server does not
    # replay on a fresh one: that file (``scenario_path`` is the program shrunk again on fresh servers)
    unreplayed_shrink_path: Optional[str] = None
    nondeterministic: bool = False
    kept_traces: Dict[str, str] = field(default_factory=dict)  # what each trace shows -> its path
    determinism_ok: Optional[bool] = None
    determinism_verdict: Optional[str] = None
    program_lines: List[str] = field(default_factory=list)
    found_s: Optional[float] = None  # cold start: process start to first failure
    found_after_examples: Optional[int] = None  # programs run up to the first failure
    first_failure_s: Optional[float] = None  # server ready to the first failure (the oracle's warm-up included)
    # registered SGLang bugs met: name -> signature, programs run by then, the program's file
    known: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    # checks turned off because a registered bug breaks them on nearly every program here:
    # check -> the bug's name (``known_bugs.waived_checks``; ``ExploreSettings.waive_known``)
    waived: Dict[str, str] = field(default_factory=dict)
    # workarounds of registered bugs the explorer's servers were started with: patch -> the bug's
    # name (``known_bugs.workarounds``; ``ExploreSettings.waive_known``, a server of its own only)
    worked_around: Dict[str, str] = field(default_factory=dict)
    # every failure signature met -> its first program as found, written the moment it was met
    kept: Dict[str, str] = field(default_factory=dict)
    # the upstream report of every registered bug named above (the search's own registry's entry:
    # ``ExploreSettings.known_bugs`` may hold bugs the built-in registry does not)
    reports: Dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.signature is not None

    def as_dict(self) -> Dict[str, Any]:
        out = dict(self.__dict__)
        out["stats"] = self.stats.as_dict()
        return out


def explore(config: ServerConfig, settings: ExploreSettings = ExploreSettings(), *, server: Any = None,
            out_dir: Path = Path(DEFAULT_OUT), progress: Callable[[str], None] = print) -> ExploreReport:
    """Explore ``config``'s server with ``settings`` (``ExploreSettings``:
    the budget, the seed, the corpus, the failure database, the known bugs,
    the replay mode, the standby...); ``server``: a running server of that
    configuration to explore instead of starting one (it is not shut down).

    Every failure met is kept (``OUT/kept/``, as found) the moment it is
    met; a new one is then also shrunk and written to ``OUT``.

    ``settings.fresh_replay``: the written file is replayed on a fresh
    server (the standby, started when the failure is found, else a
    restart); if it does not fail there, the server's history is replayed
    and shrunk (``history.recover``). Only with a server of its own
    (``server`` None): a passed-in server is replayed on as it is, and the
    report says so.

    ``settings.database``: the failure database (``failure_db.open_database``:
    a directory, ``redis://HOST:PORT``, ``none``; None: ``OUT/failure-db``):
    its programs for this build and topology run first, new failures are
    saved to it (unless ``database_read_only``). The command's default is
    ``OUT/failure-db``; ``ExploreSettings``'s is ``none``."""
    db = failure_db.open_database(settings.database, read_only=settings.database_read_only, out_dir=Path(out_dir))
    worked_around: Dict[str, str] = {}
    reports = {bug.name: bug.report for bug in settings.registry()}  # the search's own registry's
    if server is None:
        config, worked_around = work_around_known(config, settings)
        for patch, name in worked_around.items():
            progress(f"worked around: the registered {name} would end programs here, so its servers run "
                     f"with the built-in patch {patch} ({reports[name]}); its strict xfail "
                     "runs without it (--no-waive-known to leave it out)")
    profile = settings.profile
    prof = search_mod.PROFILES[profile]
    topology = config.topology
    runner = ExampleRunner(config, server=server, progress=progress, start_timeout_s=settings.start_timeout_s,
                           log_dir=settings.log_dir, example_timeout_s=settings.example_timeout_s,
                           standby=settings.standby)
    try:
        start_s = runner.ensure_server()
        warm_s = runner.warm_s  # the output oracle's references, computed before the first program
        version = str(runner.info.get("sglang_version") or "?")
        seed = settings.seed
        progress(f"exploring {topology} with the {profile} profile: up to "
                 f"{settings.max_examples or prof.max_examples} programs / "
                 f"{settings.search_time_s(prof, topology):.0f}s"
                 + (f", seed {seed}" if seed is not None else ""))
        if seed is None and not prof.derandomize:
            seed = random.randrange(2**31)  # chosen here, so the kept files name it too
        settings = settings.replace(seed=seed)
        config, waived = waive_known_checks(config, settings, version)
        if waived:
            runner.config = config
            for check, name in waived.items():
                progress(f"waived: the {check!r} check is off: the registered {name} breaks it on nearly every "
                         f"program on {topology} (SGLang {version}), stopping each there; its strict xfail keeps "
                         "it checked (--no-waive-known to check it here too)")
        written = dict(config=config, sglang_version=version, profile=profile, sglang_spec=settings.sglang_spec,
                       found_by=settings.found_by)
        store = failure_db.FailureStore(db, failure_db.key(config, version)) if db is not None else None
        # Hypothesis keeps caches of its own (e.g. .hypothesis/constants) in the
        # working directory unless told otherwise: keep them under --out, for
        # the search only (a caller's own Hypothesis storage is put back).
        home = hypothesis_configuration.storage_directory(intent_to_write=False).home_directory
        hypothesis_configuration.set_hypothesis_home_dir(Path(out_dir) / ".hypothesis")
        try:
            result = search_mod.search(runner, settings, store=store, progress=progress,
                                       events=_Events(runner, settings, Path(out_dir) / "kept", written))
        finally:
            hypothesis_configuration.set_hypothesis_home_dir(home)
        stats = result.stats
        stats.start_s = start_s
        stats.sglang_version = version
        report = ExploreReport(stats=stats, seed=result.seed, waived=dict(waived), worked_around=worked_around)
        trace_dir = Path(out_dir) / "traces" / time.strftime("%Y%m%d-%H%M%S")
        report.kept = result.kept
        for name, (program, outcome, after) in result.known.items():
            report.known[name] = {"signature": outcome.signature, "after_programs": after,
                                  "scenario": result.kept.get(outcome.signature)}
        named = set(report.known) | set(report.waived.values()) | set(report.worked_around.values())
        report.reports = {name: reports[name] for name in named if name in reports}
        if result.program is not None:
            outcome = result.outcome
            report.signature = outcome.signature
            if store is not None:
                store.save(result.program)
            # the oracle's reference warm-up runs between server ready and the search
            report.first_failure_s = (stats.first_failure_s or 0) + warm_s
            report.found_s = report.first_failure_s + start_s
            report.found_after_examples = result.found_after_examples
            report.program_lines = A.describe_program(result.program)
            found_after = (f"first failing after {result.found_after_examples} programs, "
                           f"{report.found_s:.0f}s from a cold start")

            def write(program, earlier=(), note="", failed=outcome, shrunk=True):
                return writer.write_scenario(
                    Path(out_dir), program, failed, **{**written, "found_by": FOUND_BY}, seed=result.seed,
                    found_after=found_after, earlier=earlier, history_note=note, shrunk=shrunk)

            path = write(result.program, shrunk=not result.needs_history)
            trace_dir = Path(out_dir) / "traces" / path.stem
            report.scenario_path = str(path)
            budget_s = prof.shrink_time_s if settings.shrink_time_s is None else settings.shrink_time_s
            progress(f"wrote {path} ({len(result.program)} actions, "
                     + ("as first found: it needs its history)" if result.needs_history else
                        f"shrunk from {len(result.first_program or result.program)})"))
            trace_dir.mkdir(parents=True, exist_ok=True)
            if result.needs_history:
                # It passed alone on a fresh server already (right after its crash): straight to its history.
                report.replayed_fresh = True
                _recover_history(runner, report, result, budget_s=budget_s, trace_dir=trace_dir, write=write,
                                 fresh_note="it passed alone on a fresh server right after it crashed",
                                 kept_traces={}, progress=progress)
                progress(report.replay_verdict)
                return _finish(report, runner)
            # Run the written file, then the program as explored: the first
            # shows the file reproduces the failure, the pair is the
            # determinism check (same program text, two runs, same trace?).
            file_trace = trace_dir / "replay-of-written-file.jsonl"
            sig = signature_of(runner.run_file(str(path), trace=file_trace))
            report.replay_matches = sig == outcome.signature
            report.replay_verdict = (f"the written file replays it on the explorer's server: {sig}"
                                     if report.replay_matches else
                                     f"the written file did NOT reproduce it on the explorer's server: "
                                     f"got {sig or 'PASS'}")
            if settings.check_determinism:
                again_trace = trace_dir / "replay-of-program.jsonl"
                again = runner.run(result.program, trace=again_trace)
                report.determinism_ok, report.determinism_verdict = determinism.check_traces(
                    (sig, str(file_trace)), (again.signature, str(again_trace)), topology=topology)
            if settings.fresh_replay and runner.owns_server:
                _replay_fresh(runner, report, result, path, trace_dir, budget_s=budget_s, same_trace=file_trace,
                              same_sig=sig, write=write, progress=progress)
            elif settings.fresh_replay:
                report.replay_verdict += " (not a fresh one: the server was passed in, so it is replayed on as is)"
            progress(report.replay_verdict)
        elif settings.check_determinism and result.longest_passing:
            report.determinism_ok, report.determinism_verdict = determinism.check(
                runner, result.longest_passing, trace_dir=trace_dir, label="longest")
        return _finish(report, runner, progress)
    finally:
        runner.close()


def _finish(report: ExploreReport, runner: ExampleRunner, progress=lambda line: None) -> ExploreReport:
    if report.determinism_verdict:
        progress(report.determinism_verdict)
    report.stats.restarts = runner.restarts
    return report


class _Events(search_mod.SearchEvents):
    """What the explorer does during its search (``search.SearchEvents``
    says why these three cannot wait for it to return): keep the first
    program of every failure as found (``OUT/kept/``), start the standby
    when the first new failure is found (its fresh replay will want a fresh
    server), and say whether that failure comes back alone on a fresh
    server (only with ``fresh_replay``)."""

    def __init__(self, runner: ExampleRunner, settings: ExploreSettings, kept_dir: Path,
                 written: Dict[str, Any]) -> None:
        self.runner, self.settings, self.kept_dir, self.written = runner, settings, kept_dir, written
        seed = settings.seed
        self.run_label = f"the run ({settings.profile} profile, {f'seed {seed}' if seed is not None else 'derandomized'})"

    def met(self, finding: search_mod.Finding) -> Optional[str]:
        # Never lost: the first program of every failure, as found, written at once.
        return str(writer.write_kept(self.kept_dir, finding.program, finding.outcome, position=finding.position,
                                     known_name=finding.known, run=self.run_label, seed=self.settings.seed,
                                     **self.written))

    def found(self, finding: search_mod.Finding) -> None:
        if self.settings.fresh_replay and self.runner.owns_server:
            self.runner.start_standby()

    def alone(self, finding: search_mod.Finding) -> Optional[bool]:
        return _alone_after_crash(self.runner, finding.program, finding.outcome) if self.settings.fresh_replay \
            else None


def _alone_after_crash(runner: ExampleRunner, program, outcome) -> Optional[bool]:
    """Right after a first failure that killed the scheduler, the next
    server is fresh anyway: run the program alone on it. Whether it failed
    the same way; None when the server is alive (finding out would cost a
    restart; the written file's fresh replay does it later) or not owned."""
    if not runner.owns_server or runner.server is None or runner.server.alive:
        return None
    return runner.run(program).signature == outcome.signature


def _replay_fresh(runner: ExampleRunner, report: ExploreReport, result, path: Path, trace_dir: Path, *,
                  budget_s: float, same_trace: Path, same_sig: Optional[str], write, progress) -> None:
    """Replay the written file on a fresh server. If it does not fail there,
    recover the history it needs (``history.recover``) and write that as the
    scenario, or call the failure nondeterministic, keeping both traces."""
    outcome = result.outcome
    runner.fresh_server("replaying the written file on a fresh server")
    fresh_trace = trace_dir / "replay-on-fresh-server.jsonl"
    sig = signature_of(runner.run_file(str(path), trace=fresh_trace))
    report.replayed_fresh = True
    if sig == outcome.signature:
        report.replay_matches = True
        report.replay_verdict = f"the written file replays it on a fresh server: {sig}"
        return
    _recover_history(runner, report, result, budget_s=budget_s, trace_dir=trace_dir, write=write,
                     fresh_note=f"the written file got {sig or 'PASS'} on a fresh server",
                     kept_traces={f"the written file on the explorer's server ({same_sig or 'PASS'})": str(same_trace),
                                  f"the written file on a fresh server ({sig or 'PASS'})": str(fresh_trace)},
                     progress=progress)


def _recover_history(runner: ExampleRunner, report: ExploreReport, result, *, budget_s: float, trace_dir: Path,
                     write, fresh_note: str, kept_traces: Dict[str, str], progress) -> None:
    """The failure does not come back alone on a fresh server: replay and
    shrink its server's history (``history.recover``), write the file that
    runs what it needs first and check it on a fresh server; or, if the
    history does not bring it back either, call it nondeterministic and
    keep the traces of the runs."""
    outcome = result.outcome
    first = result.first_outcome or outcome
    # the search runs programs only; a scenario file run before it is not inlined
    earlier = [e for e in runner.history_before(first) if not isinstance(e, str)]
    recovery = history_mod.recover(runner, earlier=earlier, program=result.first_program or result.program,
                                   shrunk=result.program, signature=outcome.signature,
                                   budget_s=budget_s, trace_dir=trace_dir, progress=progress)
    report.history_verdict = recovery.verdict
    if not recovery.reproduced:
        report.nondeterministic = True
        report.replay_matches = False
        report.replay_verdict = f"NOT reproduced: {fresh_note}, and {recovery.verdict}"
        report.kept_traces = {**kept_traces, **recovery.traces}
        return
    note = ((f"shrunk from {len(result.first_program or result.program)} actions by delta debugging on "
             f"{recovery.trials} fresh servers (Hypothesis's shrink on the explorer's server did not replay on "
             "a fresh one)") if recovery.alone else
            f"shrunk from {recovery.history_len} by delta debugging on {recovery.trials} fresh servers")
    note += "" if recovery.shrink_complete else "; the budget ran out before the shrink ended"
    history_path = write(recovery.program, recovery.earlier, note, recovery.outcome or outcome)
    if recovery.alone:  # no history: the program shrunk again on fresh servers replaces the shrink that leaned
        report.unreplayed_shrink_path = report.scenario_path  # on the explorer's server
    else:
        report.standalone_path = report.scenario_path
    report.scenario_path = str(history_path)
    report.program_lines = A.describe_program(recovery.program)
    what = "file" if recovery.alone else "history file"
    progress(f"wrote {history_path} (" + (f"{len(recovery.program)} actions, shrunk again on fresh servers"
                                          if recovery.alone else
                                          f"{len(recovery.earlier)} earlier programs, then {len(recovery.program)} "
                                          "actions") + ")")
    runner.fresh_server(f"replaying the {what} on a fresh server")
    got = signature_of(runner.run_file(str(history_path), trace=trace_dir / "replay-of-history-file.jsonl"))
    report.replay_matches = got == outcome.signature
    report.replay_verdict = (f"the {what} replays it on a fresh server: {got}" if report.replay_matches
                             else f"the {what} did NOT reproduce it on a fresh server: got {got or 'PASS'}")


def waive_known_checks(config: ServerConfig, settings: ExploreSettings,
                       version: Optional[str]) -> Tuple[ServerConfig, Dict[str, str]]:
    """``config`` with the checks off that a registered bug breaks on nearly
    every program on its topology and ``version`` (``known_bugs.waived_checks``;
    none unless ``settings.waive_known``), and {check: bug name} of those.
    The written files' replay commands then skip them too."""
    from scripted_runtime.scheduler_side import invariants

    if not settings.waive_known:
        return config, {}
    waived = known_bugs_mod.waived_checks(settings.registry(), topology=config.topology, sglang_version=version,
                                          checks=config.checks)
    if not waived:
        return config, {}
    names = invariants.all_names() if config.checks is True else tuple(config.checks)
    return dataclasses.replace(config, checks=tuple(n for n in names if n not in waived)), waived


def work_around_known(config: ServerConfig, settings: ExploreSettings,
                      version: Optional[str] = None) -> Tuple[ServerConfig, Dict[str, str]]:
    """``config`` with the workaround patches of the registered bugs that
    apply to its topology and ``version`` (None: the installed release)
    added after its own patches, and {patch: bug name} of those added; none
    unless ``settings.waive_known``. Asked before the server starts, so the
    release is the one this interpreter imports (the one its servers run)."""
    if not settings.waive_known:
        return config, {}
    if version is None:
        from scripted_runtime.hooks import sglang_compat

        version = sglang_compat.installed_sglang_version()
    added = {patch: name for patch, name in known_bugs_mod.workarounds(
        settings.registry(), topology=config.topology, sglang_version=version).items()
        if patch not in config.patches}
    if not added:
        return config, {}
    return config.replace(patches=config.patches + tuple(added)), added


def print_report(report: ExploreReport, *, profile: str, out=print) -> None:
    stats = report.stats
    out(stats.summary())
    out("coverage, control operation x scheduler phase (operations processed against that state):")
    out(stats.coverage_table())
    if stats.fuzz_table():
        out(stats.fuzz_table())
    if report.seed is not None:
        out(f"seed: {report.seed} (rerun with --seed {report.seed})")
    else:
        out(f"seed: derandomized ({profile} profile: the same programs every run)")
    for patch, name in report.worked_around.items():
        out(f"worked around: {name}: its servers ran with the patch {patch}")
    for check, name in report.waived.items():
        out(f"waived: {name}: the {check!r} check was off (it fails nearly every program here; "
            f"reported upstream: {report.reports.get(name, '?')})")
    for name, met in report.known.items():
        out(f"known: {name}: {met['signature']} (first after {met['after_programs']} programs; "
            f"reported upstream: {report.reports.get(name, '?')}; program: {met['scenario']})")
    for signature, path in report.kept.items():
        out(f"kept (as found): {signature}: {path}")
    if report.failed:
        out(f"FAILURE: {report.signature}")
        out(f"  found {report.found_s:.1f}s after a cold start; shrunk program:")
        for i, line in enumerate(report.program_lines, 1):
            out(f"    {i}. {line}")
        out(f"  scenario: {report.scenario_path}")
        if report.history_verdict:
            out(f"  {report.history_verdict}")
        if report.standalone_path:
            out(f"  (the failing program alone, which passes on a fresh server: {report.standalone_path})")
        if report.unreplayed_shrink_path:
            out(f"  (its shrink on the explorer's server, which passes on a fresh server: "
                f"{report.unreplayed_shrink_path})")
        out(f"  {report.replay_verdict}")
        for what, trace in report.kept_traces.items():
            out(f"  trace kept: {what}: {trace}")
