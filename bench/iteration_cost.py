"""Where does the harness's per-iteration cost go? Timed inside the scheduler.

    .venv/bin/python bench/iteration_cost.py [--topologies pp1-normal,pp1-overlap] [--decode 300] [--repeat 5]

On one server per topology, runs the decode script of ``bench/invariants.py``
(one request, ``--decode`` tokens, one yield per iteration) as ``run`` does
(``default``: every check on, trace written) and with everything off
(``bare``), alternating, ``--repeat`` rounds. Around each run a probe
(``bench/probe_scripts.py``) wraps the driver's per-iteration pieces in
``perf_counter_ns`` timers inside the scheduler process: the whole driver
call at the iteration's start, the batch record at each forward, the window
scan, the observer's after-script work and inside it the state scan, every
check, the trace snapshot and the trace line's encoding. Prints, per piece,
microseconds per iteration (median over rounds), and the wall-clock cost
per iteration of ``default`` over ``bare`` (from the decode's own steps and
seconds, within a round): the in-process timers miss what the harness's
work costs SGLang's own code afterwards (caches), the wall difference does
not. A timer costs ~0.1 us a call; the ``(all)`` rows include their pieces.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from compare_scripts import HARNESS_CONFIGS, decode  # noqa: E402
from probe_scripts import install_piece_timers, take_piece_timers  # noqa: E402
from stats import machine_line, md_table, min_max  # noqa: E402

from scripted_runtime import ScriptedServer  # noqa: E402

CONFIGS = ("bare", "default")


def one_run(server, config: str, n: int, out: str):
    """(wall us per iteration, {piece: us per iteration}) of one decode run."""
    server.run(install_piece_timers, invariants=False, trace=False).raise_if_failed()
    try:
        server.run(decode, n, out, **HARNESS_CONFIGS[config]).raise_if_failed()
    finally:
        timers = server.run(take_piece_timers, invariants=False, trace=False)
    timers.raise_if_failed()
    with open(out) as f:
        v = json.load(f)
    steps = v["steps"]
    pieces = {name: total_ns / 1e3 / steps for name, (total_ns, _calls) in timers.value.items()}
    return v["wall_s"] * 1e6 / steps, pieces


def measure(topology: str, n: int, repeat: int):
    print(f"[bench] {topology}: starting server...", file=sys.stderr, flush=True)
    server = ScriptedServer.start(topology=topology)
    out = tempfile.mktemp(suffix=".json")
    walls: Dict[str, List[float]] = {c: [] for c in CONFIGS}
    pieces: Dict[str, Dict[str, List[float]]] = {c: {} for c in CONFIGS}
    try:
        server.run(decode, 8, out).raise_if_failed()  # warm up
        for i in range(repeat):
            for config in (CONFIGS if i % 2 == 0 else tuple(reversed(CONFIGS))):
                wall, per = one_run(server, config, n, out)
                walls[config].append(wall)
                for name, us in per.items():
                    pieces[config].setdefault(name, []).append(us)
            print(f"[bench] {topology}: round {i + 1}/{repeat}: "
                  + ", ".join(f"{c} {walls[c][-1]:.0f} us/it" for c in CONFIGS), file=sys.stderr, flush=True)
    finally:
        server.shutdown()
    return walls, pieces


def tables(results) -> str:
    rows = []
    for topology, (walls, pieces) in results.items():
        over = [d - b for d, b in zip(walls["default"], walls["bare"])]
        rows.append([topology, "wall: default - bare (within a round)", f"{statistics.median(over):+.1f}",
                     min_max(over, "{:+.0f}")])
        for config in CONFIGS:
            rows.append([topology, f"wall: {config}", f"{statistics.median(walls[config]):.0f}",
                         min_max(walls[config])])
        for config in CONFIGS:
            for name in sorted(pieces[config], key=lambda k: -statistics.median(pieces[config][k])):
                values = pieces[config][name]
                if max(values) < 0.05:
                    continue  # not run in this configuration
                rows.append([topology, f"{config}: {name}", f"{statistics.median(values):.1f}",
                             min_max(values, "{:.1f}")])
    return md_table(["topology", "piece", "us/iteration median", "min..max"], rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topologies", default="pp1-normal,pp1-overlap")
    ap.add_argument("--decode", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    started = machine_line()
    wall = time.monotonic()
    results = {t: measure(t, args.decode, args.repeat) for t in args.topologies.split(",")}
    print(f"\nPer-iteration harness cost timed inside the scheduler, {started}, tiny model on CPU, "
          f"{args.decode}-token decode, {args.repeat} rounds, {time.monotonic() - wall:.0f} s\n")
    print(tables(results))


if __name__ == "__main__":
    main()
