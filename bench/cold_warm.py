"""The harness's per-iteration work right after a forward against the same
work again at once: how much of its cost is cold caches?

    .venv/bin/python bench/cold_warm.py [--topologies pp1-normal] [--decode 300] [--repeats 2]

On one server per topology, the 300-token decode of ``bench/invariants.py``
runs as ``run`` does (every check on, the trace written). At each iteration,
just before the observer's after-script work (``bench/probe_scripts.py``,
``install_cold_warm``), the state scan, three invariants (slot ownership,
pool accounting, radix locks) and the trace snapshot are timed on the state
the forward left (cold), then ``--repeats`` times again right away on the
same state (warm); then the observer's own work runs as usual. The first pass finds the harness's code and the
scheduler's objects evicted by the forward; the later ones find them in
cache. Prints microseconds per iteration (median over iterations) per
piece and pass.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from compare_scripts import HARNESS_CONFIGS, decode  # noqa: E402
from probe_scripts import COLD_WARM_PIECES, install_cold_warm, take_cold_warm  # noqa: E402
from stats import machine_line, md_table  # noqa: E402

from scripted_runtime import ScriptedServer  # noqa: E402


def measure(topology: str, n: int, repeats: int):
    print(f"[bench] {topology}: starting server...", file=sys.stderr, flush=True)
    server = ScriptedServer.start(topology=topology)
    out = tempfile.mktemp(suffix=".json")
    try:
        server.run(decode, 8, out).raise_if_failed()  # warm up
        server.run(install_cold_warm, repeats, invariants=False, trace=False).raise_if_failed()
        try:
            server.run(decode, n, out, **HARNESS_CONFIGS["default"]).raise_if_failed()
        finally:
            rows = server.run(take_cold_warm, invariants=False, trace=False)
        rows.raise_if_failed()
    finally:
        server.shutdown()
    return rows.value


def table(results) -> str:
    out = []
    for topology, rows in results.items():
        passes = len(rows[0])
        for i, piece in enumerate(COLD_WARM_PIECES):
            cells = [f"{statistics.median(r[p][i] for r in rows) / 1e3:.1f}" for p in range(passes)]
            out.append([topology, piece, *cells])
        sums = [sum(statistics.median(r[p][i] for r in rows) for i in range(len(COLD_WARM_PIECES))) / 1e3
                for p in range(passes)]
        out.append([topology, "the five pieces above", *[f"{x:.1f}" for x in sums]])
        out.append([topology, "iterations", str(len(rows)), *[""] * (passes - 1)])
    head = ["topology", "piece", "cold (right after the forward)"] + [f"warm {k}" for k in range(1, passes)]
    return md_table(head, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topologies", default="pp1-normal")
    ap.add_argument("--decode", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    started = machine_line()
    wall = time.monotonic()
    results = {t: measure(t, args.decode, args.repeats) for t in args.topologies.split(",")}
    print(f"\nCold against warm, us per iteration (median), {started}, tiny model on CPU, "
          f"{args.decode}-token decode, {time.monotonic() - wall:.0f} s\n")
    print(table(results))


if __name__ == "__main__":
    main()
