"""How often does one corrupted KV entry change the greedy output?

    .venv/bin/python bench/sensitivity.py [--cases 625] [--weights context,random,dummy] [--seed 1]

For each weights configuration, one pp1-normal server runs
``sensitivity_scripts.kv_sensitivity`` (its docstring says what a case is):
``--cases`` cases, a fifth each of the corruption kinds zero,
other_request, other_position, noise and the control ``none``. Prints, per
configuration and kind, the fraction of cases whose output changed within
``NEW_TOKENS`` tokens (the sensitivity; ``none`` must stay at 0: the
false-positive control) and the median index of the first changed token.

Weights:

* ``context``: the CPU default, the context-sensitive construction
  (``scripted_runtime/user_side/models/construction.py``), seed 0;
* ``random``: ``randn * 0.02``, what the output oracle compared under before
  the construction (a dummy-weight server after its first weight update);
* ``dummy``: SGLang's dummy weights (uniform in +-1e-3).
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

from sensitivity_scripts import KINDS, NEW_TOKENS, kv_sensitivity  # noqa: E402
from stats import machine_line, md_table  # noqa: E402

WEIGHTS = ("context", "random", "dummy")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=625, help="cases per weights configuration (a fifth per kind)")
    ap.add_argument("--weights", default=",".join(WEIGHTS), help=f"comma-separated, of {', '.join(WEIGHTS)}")
    ap.add_argument("--seed", type=int, default=1, help="draws the prompts, positions and noise")
    ap.add_argument("--topology", default="pp1-normal")
    args = ap.parse_args(argv)
    chosen = [w for w in args.weights.split(",") if w]
    unknown = [w for w in chosen if w not in WEIGHTS]
    if unknown or not chosen:
        ap.error(f"--weights: unknown {unknown}; choose from {', '.join(WEIGHTS)}")
    if args.cases < len(KINDS):
        ap.error(f"--cases must be at least {len(KINDS)} (one per kind)")
    args.weights = chosen
    return args


def summarize(rows: List[dict]) -> Dict[str, dict]:
    """kind -> {seen, cases, fraction, median_first}; plus "all" over the corruptions (not ``none``)."""
    out: Dict[str, dict] = {}
    for kind in list(KINDS) + ["all"]:
        picked = [r for r in rows if (r["kind"] == kind if kind != "all" else r["kind"] != "none")]
        seen = [r for r in picked if r["seen"]]
        firsts = [r["first_difference"] for r in seen if r["first_difference"] is not None]
        out[kind] = {"seen": len(seen), "cases": len(picked),
                     "fraction": len(seen) / len(picked) if picked else float("nan"),
                     "median_first": statistics.median(firsts) if firsts else None}
    return out


def table(results: Dict[str, Dict[str, dict]]) -> str:
    header = ["weights"] + [k for k in KINDS if k != "none"] + \
        ["all corruptions", "none (control, must be 0)", "median first changed token"]
    rows = []
    for weights, summary in results.items():
        cells = [weights]
        for kind in [k for k in KINDS if k != "none"] + ["all", "none"]:
            s = summary[kind]
            cells.append(f"{s['seen']}/{s['cases']} ({s['fraction']:.1%})")
        cells.append(str(summary["all"]["median_first"]))
        rows.append(cells)
    return md_table(header, rows)


def measure(weights: str, cases: int, seed: int, topology: str, progress) -> List[dict]:
    from scripted_runtime import ScriptedServer

    overrides = {} if weights == "context" else {"load_format": "dummy"}
    server = ScriptedServer.start(topology=topology, **overrides)
    try:
        if weights == "random":  # a dummy-weight server's update loads randn * 0.02 (seed 0)
            from scripted_runtime.scheduler_side import output_oracle

            loaded = server.run(output_oracle.warm, [], trace=False, invariants=False)
            if not loaded.passed:
                raise RuntimeError(f"loading the random checkpoint failed: {loaded.error}")
        with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as f:
            out_path = f.name
        t0 = time.monotonic()
        result = server.run(kv_sensitivity, cases, seed, out_path, trace=False, invariants=False,
                            timeout=60 + 2.0 * cases, max_steps=400 * cases)
        if not result.passed:
            raise RuntimeError(f"the sensitivity script failed: {result.error}")
        progress(f"{weights}: {cases} cases in {time.monotonic() - t0:.0f}s")
        return [json.loads(line) for line in Path(out_path).read_text().splitlines()]
    finally:
        server.shutdown()


def main(argv=None) -> int:
    args = parse_args(argv)
    results = {}
    for weights in args.weights:
        rows = measure(weights, args.cases, args.seed, args.topology, lambda m: print(m, file=sys.stderr, flush=True))
        results[weights] = summarize(rows)
    print(f"KV-entry sensitivity: one entry of a request's prompt corrupted in every layer after its prefill, "
          f"{NEW_TOKENS} greedy tokens compared with the prompt run alone; {args.topology}, seed {args.seed}")
    print(machine_line())
    print()
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
