"""Cost of the per-iteration invariants and the step trace.

    .venv/bin/python bench/invariants.py [--topologies pp1-overlap,pp1-normal] [--decode 200] [--repeat 5]

On one server per topology, runs the same decode script (one request,
``--decode`` tokens, one yield per iteration) in three configurations,
interleaved ``--repeat`` times so machine noise hits all of them alike:

* ``bare``: invariants off, no trace;
* ``invariants``: all four invariants on, no trace;
* ``default``: invariants on and the JSONL trace written (what ``run`` does).

Prints decode steps/s as median and min..max, and each configuration's
median ratio to ``bare`` (target: invariants >= 0.90).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from compare_scripts import HARNESS_CONFIGS as CONFIGS, decode  # noqa: E402

from scripted_runtime import ScriptedServer  # noqa: E402


def measure(topology: str, n: int, repeat: int) -> dict:
    print(f"[bench] {topology}: starting server...", file=sys.stderr, flush=True)
    server = ScriptedServer.start(topology=topology)
    out = tempfile.mktemp(suffix=".json")
    try:
        server.run(decode, 8, out).raise_if_failed()  # warm up
        rates = {name: [] for name in CONFIGS}
        for i in range(repeat):
            for name, cfg in CONFIGS.items():
                server.run(decode, n, out, **cfg).raise_if_failed()
                with open(out) as f:
                    v = json.load(f)
                rates[name].append(v["steps"] / v["wall_s"])
            print(f"[bench] {topology}: round {i + 1}/{repeat}: "
                  + ", ".join(f"{k} {r[-1]:.0f}" for k, r in rates.items()), file=sys.stderr, flush=True)
        return rates
    finally:
        server.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topologies", default="pp1-overlap,pp1-normal")
    ap.add_argument("--decode", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    started = time.strftime("%Y-%m-%d")
    rows = []
    for topology in args.topologies.split(","):
        rates = measure(topology, args.decode, args.repeat)
        base = statistics.median(rates["bare"])
        for name, values in rates.items():
            med = statistics.median(values)
            rows.append((topology, name, med, min(values), max(values), med / base))
    print(f"\nInvariant and trace overhead, {started}, tiny Qwen2 on CPU, {args.decode}-token decode, "
          f"{args.repeat} interleaved runs each\n")
    print("| topology | configuration | decode steps/s median | min..max | vs bare |")
    print("|---|---|---|---|---|")
    for topology, name, med, lo, hi, ratio in rows:
        print(f"| {topology} | {name} | {med:.0f} | {lo:.0f}..{hi:.0f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
