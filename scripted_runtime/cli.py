"""``scripted-runtime`` command line.

    scripted-runtime run PATH_OR_MODULE:FUNCTION [--pp N] [--overlap/--no-overlap]
                     [--device cpu|cuda] [--sglang-arg k=v ...] [--timeout S]
                     [--no-invariants | --skip-invariant NAME ...] [--trace FILE]
                     [--revert-fix NAME ...]
    scripted-runtime trace show FILE [--last N]
    scripted-runtime trace render FILE -o OUT.svg|OUT.html|OUT.png [--steps A:B]

Exit codes: 0 the scenario passed, 1 it failed, 2 a usage error (bad path,
missing function, bad engine argument, unreadable trace) or the server could
not start.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import sys
import time
from typing import List, Optional

EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    pass


def check_script_spec(spec: str) -> str:
    """Validate PATH.py:FUNCTION or MODULE:FUNCTION without importing it
    (scenarios import scheduler-side code); returns the spec to run."""
    where, sep, func = spec.rpartition(":")
    if not sep or not where or not func:
        raise UsageError(f"scenario must be PATH.py:FUNCTION or MODULE:FUNCTION, got {spec!r}")
    if where.endswith(".py") or os.sep in where:
        path = os.path.abspath(where)
        if not os.path.isfile(path):
            raise UsageError(f"scenario file not found: {where}")
    else:
        try:
            found = importlib.util.find_spec(where)
        except (ImportError, ValueError):
            found = None
        if found is None or not found.origin or not found.origin.endswith(".py"):
            raise UsageError(f"scenario module not found: {where}")
        path = found.origin
    with open(path) as f:
        try:
            tree = ast.parse(f.read(), filename=path)
        except SyntaxError as exc:
            raise UsageError(f"{where}: syntax error at line {exc.lineno}: {exc.msg}") from exc
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if func.split(".")[0] not in names:
        known = ", ".join(sorted(names)) or "none"
        raise UsageError(f"{where} has no function {func!r} (functions: {known})")
    return f"{path}:{func}"


def _cmd_run(args: argparse.Namespace) -> int:
    from scripted_runtime import engine_config
    from scripted_runtime.errors import EngineArgumentError, ServerStartError
    from scripted_runtime.server import ScriptedServer

    from scripted_runtime import invariants

    try:
        spec = check_script_spec(args.scenario)
        topology = engine_config.topology_for(args.pp, args.overlap)
        overrides = engine_config.parse_engine_args(args.sglang_arg or [])
        skipped = invariants.validate_names(args.skip_invariant or [])
        from hooks import fix_toggles

        reverted = fix_toggles.validate(args.revert_fix or [])
        checked = False if args.no_invariants else [n for n in invariants.NAMES if n not in skipped]
    except (UsageError, ValueError) as exc:
        print(f"scripted-runtime: {exc}", file=sys.stderr)
        return EXIT_USAGE

    print(f"[scripted-runtime] starting SGLang ({topology}, {args.device})...", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    try:
        server = ScriptedServer.start(device=args.device, topology=topology,
                                      start_timeout_s=args.start_timeout, revert_fixes=reverted,
                                      **overrides)
    except EngineArgumentError as exc:
        print(f"scripted-runtime: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ServerStartError as exc:
        print(f"scripted-runtime: server did not start: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        print(f"[scripted-runtime] server ready in {time.monotonic() - t0:.1f}s "
              f"(sglang {server.info.get('sglang_version')}, loop {server.info.get('loop_kind')})",
              file=sys.stderr, flush=True)
        result = server.run(spec, timeout=args.timeout, invariants=checked,
                            trace=args.trace or True)
    finally:
        server.shutdown()
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
    return EXIT_PASS if result.passed else EXIT_FAIL


def _parse_steps(text: Optional[str]):
    if not text:
        return None
    lo, sep, hi = text.partition(":")
    try:
        return (int(lo) if lo else 0, int(hi) if hi else 10**9)
    except ValueError:
        raise UsageError(f"--steps must be A:B (step numbers), got {text!r}") from None


def _cmd_trace_show(args: argparse.Namespace) -> int:
    from scripted_runtime.trace import timeline

    try:
        header, records = timeline.load(args.file)
    except (OSError, ValueError) as exc:
        print(f"scripted-runtime: cannot read trace: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(timeline.format_timeline(records, last=args.last, header=header))
    return EXIT_PASS


def _cmd_trace_render(args: argparse.Namespace) -> int:
    from scripted_runtime.trace import render, timeline

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
    run.add_argument("scenario", help="PATH.py:FUNCTION or MODULE:FUNCTION")
    run.add_argument("--pp", type=int, default=1, help="pipeline-parallel size: 1 or 4 (default 1)")
    run.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True,
                     help="overlap scheduling for pp=1 (SGLang's default: on)")
    run.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    run.add_argument("--sglang-arg", action="append", metavar="KEY=VALUE",
                     help="extra SGLang ServerArgs field (repeatable)")
    run.add_argument("--timeout", type=float, default=120.0, help="script timeout in seconds")
    run.add_argument("--start-timeout", type=float, default=300.0, help="server start timeout in seconds")
    run.add_argument("--no-invariants", action="store_true", help="check no invariant after each step")
    run.add_argument("--skip-invariant", action="append", metavar="NAME",
                     help="do not check this invariant (repeatable): idle_gate, slot_ownership, "
                          "radix_locks, pool_accounting")
    run.add_argument("--trace", metavar="FILE", help="write the step trace (JSON lines) here")
    run.add_argument("--revert-fix", action="append", metavar="NAME",
                     help="undo this SGLang fix in-process (repeatable; see hooks/fix_toggles.py): pr27446")
    run.set_defaults(func=_cmd_run)

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
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
