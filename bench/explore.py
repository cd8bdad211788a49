"""How many programs per minute does exploration run per topology, and where
does its time go?

    .venv/bin/python bench/explore.py [--topologies pp1-overlap,pp1-normal,pp4] [--seconds 40] [--repeat 3]
                                      [--out bench-found] [--patch SPEC] [--checks on,off]

On one server per topology, runs ``--repeat`` explorations of ``--seconds``
each (dev profile, fixed seeds 1..repeat, invariants on, no step trace: what
``scripted-runtime explore`` does) and prints programs/min as median and
min..max against the targets (pp1 >= 100/min, pp4 >= 30/min), with the
median share of the time spent in scheduler steps, HTTP (posts and arrival
waits), engine resets, the harness <-> scheduler round trip, and Hypothesis
(generation and bookkeeping). Server start is excluded and reported apart.

The search runs without the seed corpus (the throughput of generated
programs) and without shrinking, but no failure it meets is lost: the first
program of every failure signature is written to ``--out`` the moment it is
met (``bench-found/`` by default), its header naming the topology, run, seed
and position in the run, and the summary lists each one. ``--patch`` plants
a fault (a mutant) in the server, to see that.

``--checks on,off`` measures what the per-iteration checks cost a search:
per topology one server, and each round runs the same seed with every
check on and then with none (``--no-invariants``), so the two rows differ
only in the checks (the programs drawn are the same; a run with checks
off never stops at a failure the checks would have reported). Checks a
registered bug breaks on nearly every program stay off, as `explore`
waives them (the pause check at pp4 on 0.5.23).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from stats import machine_line, md_table, meets, min_max  # noqa: E402

from scripted_runtime.user_side.explore import explorer, search, writer  # noqa: E402
from scripted_runtime.user_side.explore.explore_settings import ExploreSettings  # noqa: E402
from scripted_runtime.user_side.explore.runner import ExampleRunner  # noqa: E402
from scripted_runtime.user_side.server_config import ServerConfig  # noqa: E402

TARGETS = {"pp1-overlap": 100, "pp1-normal": 100, "pp4": 30}
# Stats.time_split keys, and the column names they get here
PARTS = {"steps": "steps", "HTTP": "HTTP", "resets": "resets", "harness IPC": "IPC",
         "generation+shrinking": "Hypothesis"}


def measure(topology: str, seconds: float, repeat: int, *, out_dir: Path = Path("bench-found"),
            patches=(), server=None, checks=("on",)) -> dict:
    """``server``: a running server to use (started with ``patches``) instead of a new one.
    ``checks``: per round, a run with every check ("on") and/or none ("off"), on one server;
    with both, the result has one entry per mode (``{"on": ..., "off": ...}``)."""
    print(f"[bench] {topology}: starting server...", file=sys.stderr, flush=True)
    t0 = time.monotonic()

    def progress(line: str) -> None:
        print(f"[bench] {topology}: {line}", file=sys.stderr, flush=True)

    # The explorer's own progress lines (a restart and its reason above all:
    # a restart costs a server start and shows as a low programs/min).
    config = ServerConfig(topology, patches=tuple(patches))
    owner = ExampleRunner(config, progress=progress, server=server)
    owner.ensure_server()
    start_s = time.monotonic() - t0
    version = str(owner.info.get("sglang_version") or "?")
    if "off" in checks:
        # as explore does: the checks a registered bug breaks on nearly every program here stay off
        # (pp_pause_ignored's pause check at pp4), or the "on" rows would time programs that stop at
        # that bug, and the resets after them, against "off" rows that run them whole
        waived_config, waived = explorer.waive_known_checks(config, ExploreSettings(profile="dev"), version)
        if waived:
            owner.config = waived_config
            progress(f"checks on: waived as explore does: {waived}")
    # the same server for every mode: a mode's runner is handed the owner's
    runners = {mode: owner if mode == "on" else
               ExampleRunner(dataclasses.replace(config, checks=False), progress=progress, server=owner.server)
               for mode in checks}
    results = {mode: {"topology": topology, "rates": [], "steps_per": [], "shares": {p: [] for p in PARTS.values()},
                      "start_s": start_s, "failures": [], "version": version} for mode in checks}
    try:
        for i in range(repeat):
            for mode, runner in runners.items():
                _one_run(topology, runner, config, version, i, repeat, seconds, out_dir, results[mode], progress,
                         label="" if len(checks) == 1 else f" (checks {mode})")
    finally:
        for runner in runners.values():
            if runner is not owner:
                runner.close()
        owner.close()
    return results[checks[0]] if len(checks) == 1 else results


def _one_run(topology: str, runner: ExampleRunner, config: ServerConfig, version: str, i: int, repeat: int,
             seconds: float, out_dir: Path, into: dict, progress, *, label: str) -> None:
    rates, steps_per, shares, failures = into["rates"], into["steps_per"], into["shares"], into["failures"]

    class Keep(search.SearchEvents):
        """Each failure's first program, written the moment it is met."""

        def met(self, finding, run=i + 1):
            note = f"; known SGLang bug {finding.known}" if finding.known else ""
            path = writer.write_kept(
                out_dir, finding.program, finding.outcome, position=finding.position,
                run=f"bench run {run}/{repeat} (seed {run})", known_name=finding.known, config=config,
                sglang_version=version, seed=run, profile="dev", found_by="`bench/explore.py`")
            failures.append(f"run {run} (seed {run}), program {finding.position}: {finding.signature}"
                            f"{note} -> {path}")
            return str(path)

    settings = ExploreSettings(profile="dev", seed=i + 1, max_time_s=seconds, shrink_time_s=0, corpus=False)
    result = search.search(runner, settings, events=Keep(), progress=progress)
    st = result.stats
    rates.append(st.per_minute)
    steps_per.append(st.steps / max(1, st.examples))
    parts = st.time_split()
    for key, p in PARTS.items():
        shares[p].append(100.0 * parts[key] / max(st.wall_s, 1e-9))
    print(f"[bench] {topology}: run {i + 1}/{repeat}{label}: {st.examples} programs in {st.wall_s:.0f}s = "
          f"{st.per_minute:.0f}/min, {steps_per[-1]:.1f} steps each, {st.restarts} server restarts so far; "
          + ", ".join(f"{p} {shares[p][-1]:.0f}%" for p in PARTS.values()), file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topologies", default="pp1-overlap,pp1-normal,pp4")
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default="bench-found", help="where every failing program met is written")
    ap.add_argument("--patch", action="append", default=[], metavar="SPEC",
                    help="plant a fault: a mutant (hooks/mutants/) or MODULE:NAME, in every scheduler rank")
    ap.add_argument("--checks", default="on",
                    help="on (every check, the default), off (none), or on,off: both on one server, "
                         "alternating each round, to see what the checks cost a search")
    args = ap.parse_args()
    checks = tuple(args.checks.split(","))
    if not checks or any(c not in ("on", "off") for c in checks) or len(set(checks)) != len(checks):
        ap.error(f"--checks: expected on, off or on,off, got {args.checks!r}")
    rows = {}
    for t in args.topologies.split(","):
        got = measure(t, args.seconds, args.repeat, out_dir=Path(args.out), patches=args.patch, checks=checks)
        if len(checks) == 1:
            rows[t] = got
        else:
            rows.update({f"{t} (checks {mode})": got[mode] for mode in checks})
    print(f"\nexploration throughput, {args.repeat} x {args.seconds:.0f}s per topology ({machine_line()}):\n")
    print(table(rows))
    for t, r in rows.items():
        for line in r["failures"]:
            print(f"failure kept: {t}, {line}")


def table(rows: dict) -> str:
    """One line per topology from ``measure``'s results."""
    header = (["topology", "programs/min median", "min..max", "target", "steps/program"]
              + [f"{p} %" for p in PARTS.values()] + ["server start (s)"])
    lines = []
    for t, r in rows.items():
        target = TARGETS.get(r["topology"], 0)
        ok = "met" if meets(r["rates"], ">=", target) else "MISSED"
        lines.append([t, f"{statistics.median(r['rates']):.0f}", min_max(r["rates"]), f">= {target} ({ok})",
                      f"{statistics.median(r['steps_per']):.1f}"]
                     + [f"{statistics.median(r['shares'][p]):.0f}" for p in PARTS.values()]
                     + [f"{r['start_s']:.0f}"])
    return md_table(header, lines)


if __name__ == "__main__":
    main()
