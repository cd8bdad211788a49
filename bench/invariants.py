"""What do the per-iteration invariants, the contracts and the step trace cost a decode?

    .venv/bin/python bench/invariants.py [--topologies pp1-overlap,pp1-normal,pp1-hicache] [--decode 200] [--repeat 5] [--gc-off]

On one server per topology, runs the same decode script (one request,
``--decode`` tokens, one yield per iteration) in these configurations:

* ``bare``: every check off, no trace;
* ``invariants``: the invariants on (the HiCache ones included), no trace;
* ``hicache``: only the three HiCache invariants on, no trace (on a
  topology without HiCache they only look whether it is on);
* ``contracts``: the five control-operation contracts on, no trace;
* ``trace``: every check off, the JSONL trace written;
* ``default``: every check on and the trace written (what ``run`` does);
* with ``--gc-off``, also ``default-gc-off``: the default with Python's
  garbage collector switched off in the scheduler for that run.

Each round runs every configuration once, in an order shuffled per round
(seeded, so a re-run repeats it), ``--repeat`` rounds, so machine noise hits
all of them alike and none always runs first. Prints decode steps/s as median
and min..max, and each configuration's ratio to ``bare`` taken within each
round: median and quartiles (a slow round slows all of its runs, so the
within-round ratio is steadier than a ratio of medians), and the cost per
iteration in microseconds over ``bare`` (from the median steps/s).
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from compare_scripts import HARNESS_CONFIGS, decode  # noqa: E402
from probe_scripts import python_gc  # noqa: E402
from stats import machine_line, md_table, min_max, quartiles, ratios  # noqa: E402

from scripted_runtime import ScriptedServer  # noqa: E402
from scripted_runtime.scheduler_side import hicache_checks  # noqa: E402
from scripted_runtime.scheduler_side.invariants import CONTRACT_NAMES, INVARIANT_NAMES  # noqa: E402

GC_OFF = "default-gc-off"


def configurations(gc_off: bool) -> Dict[str, dict]:
    """name -> run() options (plus ``gc``: whether Python's GC stays on)."""
    configs = {
        "bare": dict(HARNESS_CONFIGS["bare"], gc=True),
        "invariants": {"invariants": list(INVARIANT_NAMES), "trace": False, "gc": True},
        "hicache": {"invariants": list(hicache_checks.NAMES), "trace": False, "gc": True},
        "contracts": {"invariants": list(CONTRACT_NAMES), "trace": False, "gc": True},
        "trace": {"invariants": False, "trace": True, "gc": True},
        "default": dict(HARNESS_CONFIGS["default"], gc=True),
    }
    if gc_off:
        configs[GC_OFF] = dict(HARNESS_CONFIGS["default"], gc=False)
    return configs


def round_order(names: Sequence[str], round_no: int) -> List[str]:
    """The configurations in the order round ``round_no`` runs them."""
    order = list(names)
    random.Random(round_no).shuffle(order)
    return order


def within_round_ratios(rates: Dict[str, List[float]], base: str = "bare") -> Dict[str, List[float]]:
    """Per configuration, its rate over ``base``'s in the same round."""
    return {name: ratios(values, rates[base]) for name, values in rates.items()}


def measure(topology: str, n: int, repeat: int, configs: Dict[str, dict]) -> Dict[str, List[float]]:
    print(f"[bench] {topology}: starting server...", file=sys.stderr, flush=True)
    server = ScriptedServer.start(topology=topology)
    out = tempfile.mktemp(suffix=".json")
    try:
        server.run(decode, 8, out).raise_if_failed()  # warm up
        rates: Dict[str, List[float]] = {name: [] for name in configs}
        for i in range(repeat):
            for name in round_order(configs, i):
                opts = dict(configs[name])
                gc_on = opts.pop("gc")
                if not gc_on:
                    server.run(python_gc, False, invariants=False, trace=False).raise_if_failed()
                try:
                    server.run(decode, n, out, **opts).raise_if_failed()
                finally:
                    if not gc_on:
                        server.run(python_gc, True, invariants=False, trace=False).raise_if_failed()
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
    ap.add_argument("--topologies", default="pp1-overlap,pp1-normal,pp1-hicache")
    ap.add_argument("--decode", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--gc-off", action="store_true",
                    help=f"also run {GC_OFF}: the default with Python's GC off in the scheduler")
    args = ap.parse_args()
    started = machine_line()
    wall = time.monotonic()
    configs = configurations(args.gc_off)
    results = {topology: measure(topology, args.decode, args.repeat, configs)
               for topology in args.topologies.split(",")}
    print(f"\nInvariant and trace overhead, {started}, tiny Qwen2 on CPU, {args.decode}-token decode, "
          f"{args.repeat} rounds, order shuffled per round, {time.monotonic() - wall:.0f} s\n")
    print(table(results))


def table(results: Dict[str, Dict[str, List[float]]]) -> str:
    """topology -> configuration -> steps/s per round, as a table."""
    rows = []
    for topology, rates in results.items():
        within = within_round_ratios(rates)
        bare_us = 1e6 / statistics.median(rates["bare"])
        for name, values in rates.items():
            us = 1e6 / statistics.median(values)
            rows.append([topology, name, f"{statistics.median(values):.0f}", min_max(values),
                         quartiles(within[name]), f"{us:.0f}", f"{us - bare_us:+.0f}"])
    return md_table(["topology", "configuration", "decode steps/s median", "min..max",
                     "/ bare within a round, median (q1..q3)", "us/iteration", "us over bare"], rows)


if __name__ == "__main__":
    main()
