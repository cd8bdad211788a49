"""``scripted-runtime`` command line.

    scripted-runtime run PATH_OR_MODULE:FUNCTION [--pp N] [--overlap/--no-overlap]
                     [--device cpu|cuda] [--sglang-arg k=v ...] [--timeout S]
                     [--no-invariants | --skip-invariant NAME ...] [--trace FILE]
                     [--revert-fix NAME ...]
    scripted-runtime ab SCENARIO... --a SPEC --b SPEC [--pp N] [--base-env SPEC]
    scripted-runtime bisect-check SCENARIO --sglang SPEC [--pp N] [--base-env SPEC]
    scripted-runtime trace show FILE [--last N]
    scripted-runtime trace render FILE -o OUT.svg|OUT.html|OUT.png [--steps A:B]

SPEC: ``current``, a pip requirement (``sglang==0.5.13``: a cached environment
built once), an SGLang source tree, or ``REPO@REV`` (a throwaway worktree);
append ``+revert=FIX`` to undo a fix in-process (scripted_runtime/user_side/builds/spec.py).

Exit codes: run: 0 every scenario passed, 1 one failed, 2 a usage error (bad
path, missing function, bad engine argument, unreadable trace) or the server
could not start. ab: 0 both sides ran, 1 a side could not start or did not
finish (ERROR). bisect-check: 0 pass, 1 fail, 125 the build cannot start, 255
usage error or no disk space for the build's environment (aborts a bisect).
"""
from __future__ import annotations

import argparse
import ast
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

from scripted_runtime import specs as spec_forms
from scripted_runtime.errors import UsageError
from scripted_runtime.user_side import scenario_history
from scripted_runtime.user_side.result import violation_signature

if TYPE_CHECKING:
    from scripted_runtime.user_side.explore.explore_settings import ExploreSettings
    from scripted_runtime.user_side.server_config import ServerConfig

EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def check_script_spec(spec: str) -> str:
    """Validate PATH.py:FUNCTION or MODULE:FUNCTION without importing it
    (scenarios import scheduler-side code); returns the spec to run."""
    parsed = spec_forms.parse(spec, what="scenario", forms="PATH.py:FUNCTION or MODULE:FUNCTION")
    where, func = parsed.given_where, parsed.attr
    path = parsed.source_file()
    if path is None:
        raise UsageError(f"scenario {'file' if parsed.is_file else 'module'} not found: {where}")
    with open(path) as f:
        try:
            tree = ast.parse(f.read(), filename=path)
        except SyntaxError as exc:
            raise UsageError(f"{where}: syntax error at line {exc.lineno}: {exc.msg}") from exc
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if func.split(".")[0] not in names:
        known = ", ".join(sorted(names)) or "none"
        raise UsageError(f"{where} has no function {func!r} (functions: {known})")
    try:
        scenario_history.runs_before(path, func)
    except scenario_history.HistoryError as exc:
        raise UsageError(str(exc)) from exc
    return f"{path}:{func}"


def outcome_of(result) -> dict:
    """One scenario's outcome as the A/B table and bisect-check read it."""
    verdict = "PASS" if result.passed else ("CRASH" if result.crashed else "FAIL")
    if result.passed:
        signature = ""
    elif result.violation:
        signature = violation_signature(result.violation)
    else:
        signature = (result.error or "").strip().splitlines()[0][:160] if result.error else "failed"
    return {"scenario": result.script, "status": verdict, "signature": signature,
            "steps": result.steps, "seconds": round(result.duration_s, 2)}


def _write_json(path: Optional[str], payload: dict) -> None:
    if not path:
        return
    import json

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)


def _check_patches(specs) -> List[str]:
    """``--patch`` values, checked in this process (nothing imported); a
    ValueError names the bad one and the built-in names."""
    from scripted_runtime.hooks import patches

    for spec in specs or []:
        patches.check(spec)
    return list(specs or [])


def server_config(args: argparse.Namespace, *, topology: Optional[str] = None,
                  patches: Optional[List[str]] = None) -> "ServerConfig":
    """The one ``ServerConfig`` a command's flags ask for (run, explore,
    mutate, ab, bisect-check: each reads the flags it has), validated here
    (``ServerConfig.validate``: engine arguments, fix toggles, patches,
    extensions loaded, invariant names), so what cannot run is a usage
    error (exit 2) before anything starts. ``topology``: given by the
    command itself (mutate's rows), else ``--topology`` (a feature topology,
    explore) or ``--pp``/``--overlap``. ``patches``: the command's own list
    instead of ``--patch``."""
    from scripted_runtime.user_side import engine_config
    from scripted_runtime.user_side.server_config import ServerConfig

    if topology is None and getattr(args, "topology", None):
        known = (*engine_config.TOPOLOGIES, *engine_config.FEATURE_TOPOLOGIES)
        if args.topology not in known:
            raise UsageError(f"--topology: unknown {args.topology!r}; known: {', '.join(known)}")
        flags = engine_config.topology_for(getattr(args, "pp", 1), getattr(args, "overlap", True))
        if args.topology in engine_config.TOPOLOGIES and flags not in (args.topology, "pp1-overlap"):
            raise UsageError(f"--topology {args.topology} contradicts --pp/--no-overlap (which ask for {flags}); "
                             "give one of them")
        topology = args.topology
    elif topology is None:
        topology = engine_config.topology_for(getattr(args, "pp", 1), getattr(args, "overlap", True))
    overrides = engine_config.parse_engine_args(getattr(args, "sglang_arg", None) or [])
    config = ServerConfig(topology=topology, device=getattr(args, "device", "cpu"), engine_overrides=overrides,
                          revert_fixes=tuple(getattr(args, "revert_fix", None) or ()),
                          patches=tuple((getattr(args, "patch", None) or ()) if patches is None else patches),
                          extensions=tuple(getattr(args, "extension", None) or ()))
    config.validate()  # loads the extensions first: their invariants' names are then valid
    return config.replace(checks=_checks(args))


def _checks(args: argparse.Namespace):
    """``--no-invariants`` / ``--skip-invariant NAME``: False (none), True
    (all), or the names checked (every name is validated either way)."""
    from scripted_runtime.scheduler_side import invariants

    skipped = invariants.validate_names(getattr(args, "skip_invariant", None) or [])
    if getattr(args, "no_invariants", False):
        return False
    return tuple(n for n in invariants.all_names() if n not in skipped) if skipped else True


def _cmd_run(args: argparse.Namespace) -> int:
    from scripted_runtime.errors import EngineArgumentError, ServerStartError
    from scripted_runtime.user_side.server import ScriptedServer

    try:
        specs = [check_script_spec(s) for s in args.scenario]
        config = server_config(args)
        if args.trace and len(specs) > 1:
            raise UsageError("--trace FILE takes one scenario; with several, traces go to the server's trace dir")
    except (UsageError, ValueError) as exc:
        print(f"scripted-runtime: {exc}", file=sys.stderr)
        _write_json(args.result_json, {"status": "USAGE", "error": str(exc), "outcomes": []})
        return EXIT_USAGE

    from scripted_runtime.hooks import sglang_compat

    version = sglang_compat.installed_sglang_version()
    print(f"[scripted-runtime] starting SGLang {version} ({config.topology}, {config.device})...",
          file=sys.stderr, flush=True)
    t0 = time.monotonic()
    try:
        server = ScriptedServer.start(config, start_timeout_s=args.start_timeout)
    except ServerStartError as exc:
        usage = isinstance(exc, EngineArgumentError)
        print(f"scripted-runtime: {'' if usage else 'server did not start: '}{exc}", file=sys.stderr)
        _write_json(args.result_json, {"status": "USAGE" if usage else "NO-START",
                                       "sglang_version": version, "error": str(exc), "outcomes": []})
        return EXIT_USAGE
    outcomes, results = [], []
    try:
        started_s = time.monotonic() - t0
        print(f"[scripted-runtime] server ready in {started_s:.1f}s "
              f"(sglang {server.info.get('sglang_version')}, loop {server.info.get('loop_kind')}, {server.origin})",
              file=sys.stderr, flush=True)
        _print_extensions(server.info)
        for spec in specs:
            if not server.alive:
                print(f"[scripted-runtime] scheduler dead; restarting for {spec}", file=sys.stderr, flush=True)
                server.shutdown()
                server = ScriptedServer.start(config, start_timeout_s=args.start_timeout)
            result = _run_with_history(server, spec, timeout=args.timeout, invariants=config.checks,
                                       trace=args.trace or True)
            results.append(result)
            outcome = outcome_of(result)
            bug = known_bug_of(result, topology=config.topology, sglang_version=server.info.get("sglang_version"))
            if bug is not None:
                outcome["known"] = bug.name
            outcomes.append(outcome)
            _report(result)
            if bug is not None:
                print(f"  known SGLang bug: {bug.name}: {bug.title} (report: {bug.report}; "
                      f"its scenario: {bug.scenario})")
    finally:
        server.shutdown()
        _write_json(args.result_json, {"status": "RAN", "sglang_version": version,
                                       "start_s": round(started_s, 1) if outcomes else None,
                                       "template": {"pid": server.template_pid, "shared": server.template_shared},
                                       "outcomes": outcomes})
    return EXIT_PASS if results and all(r.passed for r in results) else EXIT_FAIL


def _run_with_history(server, spec: str, **run_kwargs):
    """Run ``spec``, after the scripts its file lists to run before it
    (``RUNS_BEFORE``: the history a failure needs), each after the engine
    reset as always. An earlier script that fails ends it: its result is
    returned, named as such."""
    parsed = spec_forms.parse(spec, what="scenario")
    path, func = parsed.where, parsed.attr

    def run(script: str, last: bool):
        if last:
            return server.run(script, **run_kwargs)
        result = server.run(script, timeout=run_kwargs["timeout"], invariants=run_kwargs["invariants"], trace=False)
        print(f"[scripted-runtime] ran {script} first (RUNS_BEFORE of {func}): "
              f"{'PASS' if result.passed else 'FAIL'}", file=sys.stderr, flush=True)
        if not result.passed:
            print(f"scripted-runtime: {script}, which {spec} lists to run before it, failed; "
                  f"{func} was not run", file=sys.stderr)
        return result

    return scenario_history.run_in_order(path, func, run)


def _print_extensions(info: dict, out=None) -> None:
    """What the scheduler loaded from ``--extension`` (as its rank reports it)."""
    from scripted_runtime import extensions

    line = extensions.loaded_line(info)
    if line:
        print(line, file=out or sys.stdout)


def known_bug_of(result, *, topology: str, sglang_version: Optional[str]):
    """The registered SGLang bug a failed result is (``known_bugs.find``, as
    the explorer judges it: signature, message, the operations the script
    posted), or None."""
    if result.passed:
        return None
    from scripted_runtime import known_bugs
    from scripted_runtime.user_side.explore.runner import first_line, posted_ops, signature_of

    return known_bugs.find(signature_of(result), topology=topology, sglang_version=sglang_version,
                           message=first_line(result.error), ops=posted_ops(result))


def _report(result) -> None:
    print(result.summary())
    if result.passed and result.value is not None:
        print(f"  returned: {result.value!r}")
    reached = result.windows_reached()
    if reached:
        print("  windows reached: " + ", ".join(f"{k} x{v}" for k, v in reached.items()))
    if result.trace_path and result.passed:
        print(f"  trace: {result.trace_path}")
    if not result.passed and result.traceback:
        print(result.traceback)


def _side_options(args: argparse.Namespace) -> dict:
    """``side.run_side``'s options from ab's and bisect-check's flags (its
    ``config``: ``server_config``; a bad flag is a usage error)."""
    return dict(config=server_config(args), timeout_s=args.timeout, start_timeout_s=args.start_timeout)


def _cmd_ab(args: argparse.Namespace) -> int:
    from scripted_runtime.user_side.builds import ab, side, spec as build_spec

    try:
        scenarios = [check_script_spec(s) for s in args.scenario]
        sides = [build_spec.parse(args.a), build_spec.parse(args.b)]
        base = side.base_python(args.base_env)
        options = _side_options(args)
    except (UsageError, ValueError) as exc:
        print(f"scripted-runtime: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if base == sys.executable and sum(s.kind == "current" for s in sides) == 2:
        from scripted_runtime.user_side import server as server_mod

        # both sides fork from it: one import, not two
        server_mod.share_template_with_children(options["config"].device, tag="ab", each="each side",
                                                together="both sides")
    reports = []
    for s in sides:
        report = side.run_side(s, scenarios, base_python=base, **options)
        reports.append(report)
        if not report.ran or args.verbose:
            print((report.log or "").rstrip()[-3000:], file=sys.stderr)
    print(ab.format_table(reports))
    if args.json:
        import dataclasses
        import json

        with open(args.json, "w") as f:
            json.dump([dataclasses.asdict(r) | {"log": None} for r in reports], f, indent=1)
    return EXIT_PASS if all(r.ran for r in reports) else EXIT_FAIL


EXIT_BISECT_SKIP, EXIT_BISECT_ABORT = 125, 255
WAIVE_HELP = ("turn off the check a registered SGLang bug breaks on nearly every program where it applies "
              "(pp_pause_ignored's pause contract at pp4 on 0.5.23), and start the servers with the workaround "
              "patch of a registered race that would end programs (fence_pp_profiler_stop at pp4), so programs "
              "go on past them and can show other bugs; their strict xfails keep them checked (default: on; "
              "docs/exploring.md)")


def explore_settings(args: argparse.Namespace) -> "ExploreSettings":
    """The ``ExploreSettings`` of ``explore``'s flags."""
    from scripted_runtime.user_side.explore.explore_settings import ExploreSettings

    return ExploreSettings(
        profile=args.profile, seed=args.seed, max_examples=args.max_examples, max_time_s=args.max_time,
        shrink_time_s=args.shrink_time, stop_file=args.stop_file, check_determinism=not args.no_determinism_check,
        sglang_spec=args.sglang_label, start_timeout_s=args.start_timeout, example_timeout_s=args.timeout,
        known_bugs=() if args.no_known_bugs else None, stop_at_known=args.stop_at_known,
        corpus=not args.no_corpus, novelty=args.novelty, standby=args.standby, waive_known=args.waive_known,
        fuzz_requests=args.fuzz_requests or args.fuzz_known_crashes, fuzz_known_crashes=args.fuzz_known_crashes,
        fresh_replay=not args.same_server_replay,
        database=args.database, database_read_only=args.database_read_only)


def _cmd_explore(args: argparse.Namespace) -> int:
    """Exit 0: no new failure found (known SGLang bugs met are listed as
    ``known: NAME``, their programs written); 1: a new failure found (and
    written out); 2: usage error or the server could not start."""
    from scripted_runtime.errors import ServerStartError

    try:
        config = server_config(args)
        if args.workers < 1:
            raise UsageError(f"-n must be >= 1, got {args.workers}")
        from scripted_runtime.user_side.explore import failure_db

        failure_db.open_database(args.database, read_only=args.database_read_only, out_dir=Path(args.out))  # a bad one: exit 2 now
    except (UsageError, ValueError) as exc:
        print(f"scripted-runtime: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.sglang and args.sglang != "current":
        from scripted_runtime.user_side.explore import parallel

        return parallel.run_in_build(args)
    if args.workers > 1:
        from scripted_runtime.user_side.explore import parallel

        return parallel.run_workers(args)

    from scripted_runtime.user_side.explore import explorer, failure_db

    def progress(line: str) -> None:
        print(f"[explore {args.worker_label or config.topology}] {line}", file=sys.stderr, flush=True)

    try:
        report = explorer.explore(config, explore_settings(args), out_dir=Path(args.out), progress=progress)
    except ServerStartError as exc:
        print(f"scripted-runtime: server did not start: {exc}", file=sys.stderr)
        _write_json(args.stats_json, {"status": "NO-START", "error": str(exc)})
        return EXIT_USAGE
    except failure_db.DatabaseError as exc:
        print(f"scripted-runtime: {exc}", file=sys.stderr)
        return EXIT_USAGE
    explorer.print_report(report, profile=args.profile)
    _write_json(args.stats_json, {"status": "RAN", **report.as_dict()})
    return EXIT_FAIL if report.failed else EXIT_PASS


def _cmd_bisect_check(args: argparse.Namespace) -> int:
    """Exit codes for ``git bisect run``: 0 good, 1 bad, 125 skip (the build
    cannot start), 255 abort the bisect (usage error, or no disk space for an
    environment: bisecting on would be meaningless)."""
    from scripted_runtime.user_side.builds import side, spec as build_spec

    try:
        scenario = check_script_spec(args.scenario)
        build = build_spec.parse(args.sglang)
        base = side.base_python(args.base_env)
        options = _side_options(args)
    except (UsageError, ValueError) as exc:
        print(f"scripted-runtime: {exc}", file=sys.stderr)
        return EXIT_BISECT_ABORT
    report = side.run_side(build, [scenario], base_python=base, **options)
    outcome = report.outcomes[0]
    print((report.log or "").rstrip()[-4000:], file=sys.stderr)
    verdict = {"PASS": EXIT_PASS, "FAIL": EXIT_FAIL, "CRASH": EXIT_FAIL,
               "NO-START": EXIT_BISECT_SKIP}.get(outcome.status, EXIT_BISECT_ABORT)
    meaning = {EXIT_PASS: "good", EXIT_FAIL: "bad", EXIT_BISECT_SKIP: "skip (build cannot start)",
               EXIT_BISECT_ABORT: "abort (harness error)"}[verdict]
    print(f"bisect-check: {outcome.status} on {args.sglang} (sglang {report.sglang_version or '?'})"
          f"{': ' + outcome.signature if outcome.signature else ''} -> exit {verdict} ({meaning})")
    return verdict


def _add_server_options(p: argparse.ArgumentParser) -> None:
    """Options of every command that starts a server (run, ab, bisect-check)."""
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel size: 1 or 4 (default 1)")
    p.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True,
                   help="overlap scheduling for pp=1 (SGLang's default: on)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--sglang-arg", action="append", metavar="KEY=VALUE",
                   help="extra SGLang ServerArgs field (repeatable)")
    p.add_argument("--timeout", type=float, default=120.0, help="script timeout in seconds")
    p.add_argument("--start-timeout", type=float, default=300.0, help="server start timeout in seconds")
    p.add_argument("--no-invariants", action="store_true", help="check no invariant after each step")


def _add_side_options(p: argparse.ArgumentParser) -> None:
    _add_server_options(p)
    p.add_argument("--base-env", metavar="SPEC", default="current",
                   help="environment source-tree and REPO@REV sides run over: 'current' (default) or "
                        "a pip requirement such as sglang==0.5.12.post1")


def _add_extension_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--extension", action="append", metavar="MODULE|PATH.py",
                   help="load your own windows, invariants and explorer actions from this module, here and in "
                        "every scheduler rank (repeatable; docs/extensions.md)")


def _add_patch_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--patch", action="append", metavar="SPEC",
                   help="apply this patch in every scheduler rank (repeatable): a built-in fix toggle, "
                        "mutant or workaround NAME, or your own MODULE:ATTR / PATH.py:ATTR (see docs/mutants.md)")


def mutate_settings(args: argparse.Namespace) -> "ExploreSettings":
    """The ``ExploreSettings`` of ``mutate``'s flags (each mutant's exploration)."""
    from scripted_runtime.user_side import mutate

    return mutate.SETTINGS.replace(profile=args.profile, max_examples=args.max_examples,
                                   max_time_s=args.max_time, shrink_time_s=args.shrink_time,
                                   start_timeout_s=args.start_timeout, corpus=not args.no_corpus,
                                   novelty=args.novelty, fresh_replay=not args.same_server_replay,
                                   waive_known=args.waive_known)


def _cmd_mutate(args: argparse.Namespace) -> int:
    """Exit 0: the table is valid (the unmutated build found nothing);
    1: void on some topology; 2: usage error."""
    from scripted_runtime.user_side import engine_config, mutate

    try:
        topologies = [t for t in args.topology.split(",") if t]
        unknown = [t for t in topologies if t not in engine_config.ALL_TOPOLOGIES]
        if unknown or not topologies:
            raise UsageError(f"--topology: unknown {unknown or args.topology!r}; "
                             f"known: {', '.join(engine_config.ALL_TOPOLOGIES)}")
        names = args.mutant or ([] if args.patch else mutate.default_mutants())
        known = mutate.default_mutants()
        bad = [n for n in names if n not in known]
        if bad:
            raise UsageError(f"--mutant: unknown {bad}; built-in mutants: {', '.join(known)}")
        specs = names + _check_patches(args.patch)
        config = server_config(args, topology=topologies[0], patches=[])  # each row: its topology, its mutant
    except (UsageError, ValueError) as exc:
        print(f"scripted-runtime: {exc}", file=sys.stderr)
        return EXIT_USAGE

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    settings = mutate_settings(args)
    rows = mutate.run_table(config, settings, topologies=topologies, mutants=specs, out_dir=Path(args.out),
                            progress=progress)
    print(mutate.format_table(rows))
    _write_json(args.json, mutate.as_json(rows))
    return EXIT_FAIL if mutate.void_topologies(rows) else EXIT_PASS


def _parse_steps(text: Optional[str]):
    if not text:
        return None
    lo, sep, hi = text.partition(":")
    try:
        return (int(lo) if lo else 0, int(hi) if hi else 10**9)
    except ValueError:
        raise UsageError(f"--steps must be A:B (step numbers), got {text!r}") from None


def _cmd_trace_show(args: argparse.Namespace) -> int:
    from scripted_runtime import timeline

    try:
        header, records = timeline.load(args.file)
    except (OSError, ValueError) as exc:
        print(f"scripted-runtime: cannot read trace: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(timeline.format_timeline(records, last=args.last, header=header))
    return EXIT_PASS


def _cmd_trace_render(args: argparse.Namespace) -> int:
    from scripted_runtime.user_side import trace_render as render
    from scripted_runtime import timeline

    out = args.output
    if not out.endswith((".svg", ".html", ".png")):
        print(f"scripted-runtime: -o must end in .svg, .html or .png, got {out!r}", file=sys.stderr)
        return EXIT_USAGE
    try:
        steps = _parse_steps(args.steps)
        header, records = timeline.load(args.file)
        records = render.select_steps(records, steps)
        title = os.path.basename(args.file)
        if out.endswith(".png"):
            render.render_png(header, records, out, title=title)
        else:
            draw = render.render_html if out.endswith(".html") else render.render_svg
            text = draw(header, records, title=title)
            with open(out, "w", encoding="utf-8") as f:
                f.write(text)
    except (OSError, ValueError, UsageError) as exc:
        print(f"scripted-runtime: cannot render trace: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {out} ({len(records)} steps)")
    return EXIT_PASS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scripted-runtime", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one scenario against a freshly started server")
    run.add_argument("scenario", nargs="+",
                     help="PATH.py:FUNCTION or MODULE:FUNCTION (several run one after another on one server)")
    _add_server_options(run)
    run.add_argument("--skip-invariant", action="append", metavar="NAME",
                     help="do not check this invariant (repeatable): idle_gate, slot_ownership, "
                          "radix_locks, pool_accounting")
    run.add_argument("--topology", metavar="NAME",
                     help="a topology by name instead of --pp/--overlap (pp1-overlap, pp1-normal, pp4), or a "
                          "feature topology: pp1-hicache (docs/hicache.md), "
                          "pp1-lora (LoRA adapters loaded at run time; docs/writing-scenarios.md), "
                          "pp1-priority (priority scheduling and preemption; docs/checks.md)")
    run.add_argument("--trace", metavar="FILE", help="write the step trace (JSON lines) here")
    run.add_argument("--revert-fix", action="append", metavar="NAME",
                     help="undo this SGLang fix in-process (repeatable; see hooks/fix_toggles.py): "
                          "pr27446, pr17850, issue14062")
    _add_patch_option(run)
    _add_extension_option(run)
    run.add_argument("--result-json", metavar="FILE",
                     help="write each scenario's outcome (status, failure signature, steps, time) here")
    run.set_defaults(func=_cmd_run)

    abp = sub.add_parser("ab", help="run scenarios against two SGLang builds and compare")
    abp.add_argument("scenario", nargs="+", help="PATH.py:FUNCTION or MODULE:FUNCTION")
    abp.add_argument("--a", required=True, metavar="SPEC",
                     help="side A: current | sglang==X | SOURCE_TREE | REPO@REV, optionally +revert=FIX")
    abp.add_argument("--b", required=True, metavar="SPEC", help="side B (same forms as --a)")
    abp.add_argument("--json", metavar="FILE", help="also write the outcomes as JSON")
    abp.add_argument("-v", "--verbose", action="store_true", help="print each side's output")
    _add_side_options(abp)
    abp.set_defaults(func=_cmd_ab)

    bis = sub.add_parser("bisect-check", help="one scenario on one build; exit 0 pass, 1 fail, "
                                               "125 build cannot start (for git bisect run)")
    bis.add_argument("scenario", help="PATH.py:FUNCTION or MODULE:FUNCTION")
    bis.add_argument("--sglang", required=True, metavar="SPEC",
                     help="the build: an SGLang source tree (e.g. . in a checkout), REPO@REV, sglang==X or current")
    _add_side_options(bis)
    bis.set_defaults(func=_cmd_bisect_check)

    exp = sub.add_parser("explore", help="generate programs with Hypothesis, run them on the real scheduler, "
                                         "shrink a failure and write it out as a scenario")
    _add_server_options(exp)
    exp.add_argument("--profile", choices=["ci", "dev", "nightly"], default="dev",
                     help="ci: derandomized, 1000 programs / 60 s; dev (default): 1000 / 10 min; "
                          "nightly: 20000 / 3 h")
    exp.add_argument("--topology", metavar="NAME",
                     help="a topology by name instead of --pp/--overlap: pp1-overlap, pp1-normal, pp4, or a "
                          "feature topology: pp1-hicache (HiCache on, a 400-token "
                          "device pool, the transfer gate's hold/release actions; docs/hicache.md), pp1-lora "
                          "(LoRA on, two adapters a batch, load/unload actions and requests with an adapter), "
                          "pp1-priority (priority scheduling, three running requests, requests with priorities)")
    exp.add_argument("--max-examples", type=int, help="override the profile's program count")
    exp.add_argument("--max-time", type=float, help="override the profile's search time (s, server start excluded)")
    exp.add_argument("--shrink-time", type=float, help="override the profile's shrink time (s)")
    exp.add_argument("--seed", type=int, help="Hypothesis seed (printed by every run; not with --profile ci)")
    exp.add_argument("-n", "--workers", type=int, default=1,
                     help="parallel workers, each with its own server (for boxes with the cores)")
    exp.add_argument("--out", default="explore-found", help="where failing programs are written (default explore-found/)")
    exp.add_argument("--revert-fix", action="append", metavar="NAME",
                     help="undo this SGLang fix in-process (repeatable): pr27446, pr17850, issue14062")
    _add_patch_option(exp)
    _add_extension_option(exp)
    exp.add_argument("--sglang", metavar="SPEC",
                     help="explore another build: sglang==X (cached environment), a source tree or REPO@REV")
    exp.add_argument("--base-env", metavar="SPEC", default="current",
                     help="environment source-tree and REPO@REV builds run over")
    exp.add_argument("--no-determinism-check", action="store_true",
                     help="skip replaying a program twice to compare traces")
    exp.add_argument("--stats-json", metavar="FILE", help="also write the statistics and outcome as JSON")
    exp.add_argument("--standby", choices=["auto", "on", "off"], default="auto",
                     help="a second server kept ready to swap in when the live one dies: auto (default) from "
                          "the first crash on where servers are spawned, none where they fork from a template "
                          "(a restart takes seconds), on from the start, off (docs/exploring.md)")
    exp.add_argument("--database", metavar="SPEC", default=None,
                     help="the failure database: stored failing programs run first, new ones are saved. A "
                          "directory (default: $SCRIPTED_RUNTIME_DATABASE or failure-db under --out), "
                          "redis://HOST:PORT[/DB] (shared), or none (docs/exploring.md)")
    exp.add_argument("--database-read-only", action="store_true",
                     help="replay the database's failures first but save nothing (pull-request runs)")
    exp.add_argument("--same-server-replay", action="store_true",
                     help="replay the written failure on the explorer's own server only; by default it is "
                          "replayed on a fresh server and, if it passes there, the history it needs is "
                          "replayed and shrunk (docs/exploring.md)")
    exp.add_argument("--no-corpus", action="store_true",
                     help="skip the seed corpus (every control operation in every request phase, run first "
                          "outside the time budget; docs/exploring.md)")
    exp.add_argument("--novelty", action=argparse.BooleanOptionalAction, default=None,
                     help="novelty guidance: half the programs are mutated from those that reached new scheduler "
                          "states (default: on for the dev and nightly profiles, off for ci; without it the "
                          "states are still counted; docs/exploring.md)")
    exp.add_argument("--fuzz-requests", action="store_true",
                     help="also draw requests with malformed or extreme fields (token ids, lengths, sampling and "
                          "logprob parameters, a reused rid) and aborts of unknown rids, judged by the survival "
                          "contract; cases that meet a known bug that kills the server on this topology and "
                          "release are left out (docs/exploring.md)")
    exp.add_argument("--fuzz-known-crashes", action="store_true",
                     help="with request fuzzing, draw the cases that meet a known server-killing bug too "
                          "(each one met costs a server start); implies --fuzz-requests")
    known = exp.add_mutually_exclusive_group()
    known.add_argument("--stop-at-known", action="store_true",
                       help="stop (shrink, write, exit 1) at a known SGLang bug too; by default one is reported "
                            "as 'known: NAME' and the search goes on")
    known.add_argument("--no-known-bugs", action="store_true",
                       help="ignore the known-bug registry: every failure is a new finding")
    exp.add_argument("--waive-known", action=argparse.BooleanOptionalAction, default=True,
                     help=WAIVE_HELP)
    exp.add_argument("--stop-file", help=argparse.SUPPRESS)  # workers: stop searching once it exists
    exp.add_argument("--worker-label", help=argparse.SUPPRESS)
    exp.add_argument("--sglang-label", help=argparse.SUPPRESS)  # the SPEC a build child runs for
    exp.set_defaults(func=_cmd_explore)

    mut = sub.add_parser("mutate", help="the kill table: explore against each built-in (or your own) mutant "
                                        "and the unmutated build, per topology")
    mut.add_argument("--topology", default="pp1-overlap,pp1-normal,pp4",
                     help="comma-separated: pp1-overlap, pp1-normal, pp4, or a feature topology: pp1-hicache "
                          "(the HiCache mutants' topology), pp1-lora (the LoRA mutants'), pp1-priority (the "
                          "priority mutant's) (default: the first three)")
    mut.add_argument("--mutant", action="append", metavar="NAME",
                     help="only this built-in mutant (repeatable; default: all of hooks/mutants/)")
    _add_patch_option(mut)
    mut.add_argument("--profile", choices=["ci", "dev", "nightly"], default="ci",
                     help="exploration budget per mutant (default ci: derandomized, 1000 programs / 60 s)")
    mut.add_argument("--max-examples", type=int, help="override the profile's program count")
    mut.add_argument("--max-time", type=float, help="override the profile's search time per mutant (s)")
    mut.add_argument("--shrink-time", type=float, default=20.0,
                     help="shrink time per killed mutant (s, default 20)")
    mut.add_argument("--out", default="mutate-found", help="where each kill's program is written")
    mut.add_argument("--json", metavar="FILE", help="also write the rows and the summary as JSON")
    mut.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    mut.add_argument("--no-corpus", action="store_true", help="explore without the seed corpus (as explore --no-corpus)")
    mut.add_argument("--novelty", action=argparse.BooleanOptionalAction, default=None,
                     help="novelty guidance, as explore's (default: the profile's; off for ci)")
    mut.add_argument("--same-server-replay", action="store_true",
                     help="replay each kill's file on the explorer's server, not a fresh one (as explore)")
    mut.add_argument("--waive-known", action=argparse.BooleanOptionalAction, default=True, help=WAIVE_HELP)
    mut.add_argument("--start-timeout", type=float, default=300.0, help="server start timeout in seconds")
    mut.set_defaults(func=_cmd_mutate)

    trace = sub.add_parser("trace", help="read a step trace")
    trace_sub = trace.add_subparsers(dest="trace_command", required=True)
    show = trace_sub.add_parser("show", help="print the one-line-per-step timeline")
    show.add_argument("file")
    show.add_argument("--last", type=int, default=None, help="only the last N steps")
    show.set_defaults(func=_cmd_trace_show)
    draw = trace_sub.add_parser("render", help="draw the trace as SVG or HTML")
    draw.add_argument("file")
    draw.add_argument("-o", "--output", required=True, help="OUT.svg, OUT.html or OUT.png (PNG needs Pillow)")
    draw.add_argument("--steps", help="only steps A:B (inclusive)")
    draw.set_defaults(func=_cmd_trace_render)

    exp_p = sub.add_parser("export", help="write a scenario as a test for SGLang's own harness "
                                          "(sglang.test.scripted_runtime), for an SGLang pull request")
    exp_p.add_argument("scenario", help="PATH.py:FUNCTION")
    exp_p.add_argument("-o", "--output", required=True, help="the test file to write (test_*.py)")
    exp_p.add_argument("--pp", type=int, default=1, help="pipeline-parallel size: 1 or 4 (default 1)")
    exp_p.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True,
                       help="overlap scheduling for pp=1 (SGLang's default: on)")
    exp_p.add_argument("--check", action="store_true",
                       help="then run the written test under SGLang's harness on this CPU box")
    exp_p.add_argument("--revert-fix", action="append", metavar="NAME",
                       help="with --check: undo this SGLang fix in-process while it runs (repeatable)")
    exp_p.set_defaults(func=_cmd_export)

    envs_p = sub.add_parser("envs", help="list or prune the cached build environments (~10 GB each)")
    envs_sub = envs_p.add_subparsers(dest="envs_command", required=True)
    envs_sub.add_parser("list", help="spec, size, last use and path of each").set_defaults(func=_cmd_envs_list)
    prune = envs_sub.add_parser("prune", help="remove environments (never one in use)")
    prune.add_argument("--keep", type=int, metavar="N", help="keep the N most recently used")
    prune.add_argument("--older-than", type=float, metavar="DAYS", help="remove those unused for over DAYS days")
    prune.add_argument("--dry-run", action="store_true", help="say what would be removed; remove nothing")
    prune.set_defaults(func=_cmd_envs_prune)

    ctl = sub.add_parser("controls", help="every control request SGLang 0.5.23's scheduler dispatches and what the "
                                          "harness does with it (docs/control-requests.md)")
    ctl.add_argument("--status", choices=("scripted", "kills", "blocks", "sglang_refuses", "open", "internal"),
                     help="only the requests of this status")
    ctl.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ctl.set_defaults(func=_cmd_controls)
    return parser


def _cmd_controls(args: argparse.Namespace) -> int:
    """Print the control catalog; reads nothing, starts nothing."""
    import dataclasses
    import json

    from scripted_runtime import control_catalog

    entries = [c for c in control_catalog.CATALOG if args.status in (None, c.status)]
    if args.json:
        print(json.dumps([dataclasses.asdict(c) for c in entries], indent=1))
    else:
        print(control_catalog.table(entries))
    return EXIT_PASS


def _cmd_export(args: argparse.Namespace) -> int:
    """Exit 0: written (and with --check, it passed); 1: --check failed; 2: usage error or not exportable."""
    import subprocess

    from scripted_runtime.user_side import engine_config, export

    try:
        spec = check_script_spec(args.scenario)
        topology = engine_config.topology_for(args.pp, args.overlap)
        from scripted_runtime.hooks import fix_toggles

        reverted = fix_toggles.validate(args.revert_fix or [])
        parsed = spec_forms.parse(spec, what="scenario")
        out = export.export(parsed.where, parsed.attr, Path(args.output), topology=topology)
    except (UsageError, ValueError) as exc:
        print(f"scripted-runtime: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {out} ({topology}): run it with SGLang's harness, e.g. python -m pytest {out}")
    if not args.check:
        return EXIT_PASS
    what = " with " + ", ".join(reverted) + " reverted" if reverted else ""
    print(f"[scripted-runtime] running it under SGLang's harness on CPU{what}...", file=sys.stderr, flush=True)
    cmd = [sys.executable, "-m", "scripted_runtime.user_side.upstream_run", str(out), "--topology", topology]
    cmd += [a for f in reverted for a in ("--revert-fix", f)]
    rc = subprocess.run(cmd, timeout=1200).returncode
    print(f"export check: {'PASS' if rc == 0 else 'FAIL'} under SGLang's harness{what}")
    return EXIT_PASS if rc == 0 else EXIT_FAIL


def _cmd_envs_list(args: argparse.Namespace) -> int:
    from scripted_runtime.user_side.builds import env_cache

    print(env_cache.table(env_cache.entries()))
    return EXIT_PASS


def _cmd_envs_prune(args: argparse.Namespace) -> int:
    from scripted_runtime.user_side.builds import env_cache

    items = env_cache.entries()
    try:
        chosen = env_cache.plan_prune(items, keep=args.keep, older_than_days=args.older_than)
    except ValueError as exc:
        print(f"scripted-runtime: envs prune: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for e in items:
        if e.in_use and e not in chosen:
            print(f"keeping {e.path}: in use ({e.in_use})")
    if not chosen:
        print("nothing to remove")
        return EXIT_PASS
    verb = "would remove" if args.dry_run else "removing"
    for e in chosen:
        print(f"{verb} {e.path} ({e.requirement}, {e.size_gb:.1f} GB, last used {e.age_days:.0f} d ago)")
    if not args.dry_run:
        freed = env_cache.remove(chosen)
        print(f"freed {freed:.1f} GB")
    return EXIT_PASS


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
