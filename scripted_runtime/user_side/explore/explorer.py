"""One exploration on one topology: start (or reuse) the server, search,
write a failure out as a scenario, check that the file replays it and that
the program replays deterministically, print the statistics."""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

from scripted_runtime import known_bugs as known_bugs_mod
from scripted_runtime.user_side.explore import determinism, search as search_mod, writer
from scripted_runtime.user_side.explore.runner import ExampleRunner, signature_of
from scripted_runtime.user_side.explore.stats import Stats

DEFAULT_OUT = "explore-found"


@dataclass
class ExploreReport:
    stats: Stats
    seed: Optional[int] = None
    signature: Optional[str] = None
    scenario_path: Optional[str] = None
    replay_verdict: Optional[str] = None  # the written file, run once
    replay_matches: Optional[bool] = None
    determinism_ok: Optional[bool] = None
    determinism_verdict: Optional[str] = None
    program_lines: List[str] = field(default_factory=list)
    found_s: Optional[float] = None  # cold start: process start to first failure
    found_after_examples: Optional[int] = None  # programs run up to the first failure
    first_failure_s: Optional[float] = None  # server ready to the first failure (the oracle's warm-up included)
    # registered SGLang bugs met: name -> signature, programs run by then, the program's file
    known: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    # every failure signature met -> its first program as found, written the moment it was met
    kept: Dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.signature is not None

    def as_dict(self) -> Dict[str, Any]:
        out = dict(self.__dict__)
        out["stats"] = self.stats.as_dict()
        return out


def explore(*, topology: str, profile: str = "ci", device: str = "cpu", seed: Optional[int] = None,
            max_examples: Optional[int] = None, max_time_s: Optional[float] = None,
            shrink_time_s: Optional[float] = None,
            out_dir: Path = Path(DEFAULT_OUT), revert_fixes: Iterable[str] = (), patches: Iterable[str] = (),
            engine_overrides: Optional[Dict[str, Any]] = None, server: Any = None,
            stop_file: Optional[str] = None, check_determinism: bool = True,
            sglang_spec: Optional[str] = None, start_timeout_s: float = 300.0,
            log_dir: Optional[Path] = None, invariants: Any = True, example_timeout_s: float = 120.0,
            known_bugs: Optional[Sequence[Any]] = None, stop_at_known: bool = False, corpus: bool = True,
            found_by: str = "`scripted-runtime explore`", standby: str = "auto",
            progress: Callable[[str], None] = print) -> ExploreReport:
    """``known_bugs``: the registry to match failures against (default the
    built-in one; ``()``: every failure is new). Every failure met is kept
    (``OUT/kept/``, as found) the moment it is met; a new one is then also
    shrunk and written to ``OUT``."""
    prof = search_mod.PROFILES[profile]
    revert_fixes = list(revert_fixes)
    patches = list(patches)
    runner = ExampleRunner(topology=topology, device=device, revert_fixes=revert_fixes, patches=patches,
                           engine_overrides=engine_overrides, server=server, progress=progress,
                           start_timeout_s=start_timeout_s, log_dir=log_dir, invariants=invariants,
                           example_timeout_s=example_timeout_s, standby=standby)
    try:
        start_s = runner.ensure_server()
        warm_s = runner.warm_s  # the output oracle's references, computed before the first program
        version = str(runner.info.get("sglang_version") or "?")
        progress(f"exploring {topology} with the {profile} profile: up to "
                 f"{max_examples or prof.max_examples} programs / {max_time_s or prof.max_time_s:.0f}s"
                 + (f", seed {seed}" if seed is not None else ""))
        if seed is None and not prof.derandomize:
            seed = random.randrange(2**31)  # chosen here, so the kept files name it too
        run_label = f"seed {seed}" if seed is not None else "derandomized"

        def keep(program, outcome, position, known_name):
            # Never lost: the first program of every failure, as found, written at once.
            return str(writer.write_kept(
                Path(out_dir) / "kept", program, outcome, position=position, known_name=known_name,
                run=f"the run ({profile} profile, {run_label})", topology=topology, sglang_version=version,
                seed=seed, profile=profile, revert_fixes=revert_fixes, patches=patches, sglang_spec=sglang_spec,
                invariants=invariants, found_by=found_by))

        result = search_mod.search(runner, profile=prof, seed=seed, max_examples=max_examples,
                                   max_time_s=max_time_s, shrink_time_s=shrink_time_s,
                                   stop_file=stop_file, progress=progress, stop_at_known=stop_at_known,
                                   corpus=corpus, keep=keep,
                                   known_bugs=known_bugs_mod.REGISTRY if known_bugs is None else known_bugs)
        stats = result.stats
        stats.start_s = start_s
        stats.sglang_version = version
        report = ExploreReport(stats=stats, seed=result.seed)
        trace_dir = Path(out_dir) / "traces" / time.strftime("%Y%m%d-%H%M%S")
        report.kept = dict(result.kept)
        for name, (program, outcome, after) in result.known.items():
            report.known[name] = {"signature": outcome.signature, "after_programs": after,
                                  "scenario": result.kept.get(outcome.signature)}
        if result.program is not None:
            outcome = result.outcome
            report.signature = outcome.signature
            # the oracle's reference warm-up runs between server ready and the search
            report.first_failure_s = (stats.first_failure_s or 0) + warm_s
            report.found_s = report.first_failure_s + start_s
            report.found_after_examples = result.found_after_examples
            report.program_lines = [a.describe() for a in result.program]
            found_after = (f"first failing after {result.found_after_examples} programs, "
                           f"{report.found_s:.0f}s from a cold start")
            path = writer.write_scenario(Path(out_dir), result.program, outcome, topology=topology,
                                         sglang_version=version, seed=result.seed, profile=profile,
                                         revert_fixes=revert_fixes, patches=patches, sglang_spec=sglang_spec,
                                         found_after=found_after, invariants=invariants)
            trace_dir = Path(out_dir) / "traces" / path.stem
            report.scenario_path = str(path)
            progress(f"wrote {path} ({len(result.program)} actions, shrunk from "
                     f"{len(result.first_program or result.program)})")
            # Run the written file, then the program as explored: the first
            # shows the file reproduces the failure, the pair is the
            # determinism check (same program text, two runs, same trace?).
            trace_dir.mkdir(parents=True, exist_ok=True)
            file_trace = trace_dir / "replay-of-written-file.jsonl"
            sig = signature_of(runner.run_file(str(path), trace=file_trace))
            report.replay_matches = sig == outcome.signature
            report.replay_verdict = (f"the written file replays it: {sig}" if report.replay_matches else
                                     f"the written file did NOT reproduce it: got {sig or 'PASS'}")
            progress(report.replay_verdict)
            if check_determinism:
                again_trace = trace_dir / "replay-of-program.jsonl"
                again = runner.run(result.program, trace=again_trace)
                report.determinism_ok, report.determinism_verdict = determinism.check_traces(
                    (sig, str(file_trace)), (again.signature, str(again_trace)), topology=topology)
        elif check_determinism and result.longest_passing:
            report.determinism_ok, report.determinism_verdict = determinism.check(
                runner, result.longest_passing, trace_dir=trace_dir, label="longest")
        if report.determinism_verdict:
            progress(report.determinism_verdict)
        stats.restarts = runner.restarts
        return report
    finally:
        runner.close()


def print_report(report: ExploreReport, *, profile: str, out=print) -> None:
    stats = report.stats
    out(stats.summary())
    out("coverage, control operation x scheduler phase (operations processed against that state):")
    out(stats.coverage_table())
    if report.seed is not None:
        out(f"seed: {report.seed} (rerun with --seed {report.seed})")
    else:
        out(f"seed: derandomized ({profile} profile: the same programs every run)")
    for name, met in report.known.items():
        bug = known_bugs_mod.by_name(name)
        out(f"known: {name}: {met['signature']} (first after {met['after_programs']} programs; "
            f"reported upstream: {bug.report}; program: {met['scenario']})")
    for signature, path in report.kept.items():
        out(f"kept (as found): {signature}: {path}")
    if report.failed:
        out(f"FAILURE: {report.signature}")
        out(f"  found {report.found_s:.1f}s after a cold start; shrunk program:")
        for i, line in enumerate(report.program_lines, 1):
            out(f"    {i}. {line}")
        out(f"  scenario: {report.scenario_path}")
        out(f"  {report.replay_verdict}")
