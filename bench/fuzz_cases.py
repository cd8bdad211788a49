"""Each request-fuzzing field case alone: which does SGLang serve, refuse, or
die of? (issue 38)

One server per topology; per case one explored program (a plain request,
the fuzzed request with that one case, two steps, an abort of an unknown
rid, the end-state checks with the survival contract), run as
``scripted-runtime run`` would; a server the case killed is replaced before
the next case. Prints one line per case and a summary.

    .venv/bin/python bench/fuzz_cases.py --topology pp1-overlap [--cases a,b] [--json out.json]

About a minute at pp=1 (each crash costs a server start, ~25 s).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripted_runtime import ScriptedServer  # noqa: E402
from scripted_runtime.scheduler_side import request_fuzz  # noqa: E402
from scripted_runtime.user_side.explore import actions as A  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topology", default="pp1-overlap")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: every case)")
    ap.add_argument("--json", help="also write every case's outcome to this file")
    args = ap.parse_args()
    names = [c for c in args.cases.split(",") if c] or [c.name for c in request_fuzz.CASES]
    unknown = [c for c in names if c not in request_fuzz.BY_NAME]
    if unknown:
        print(f"unknown case(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    results = {}
    with tempfile.TemporaryDirectory(prefix="fuzz-cases-") as tmp:
        server = ScriptedServer.start(topology=args.topology)
        try:
            for name in names:
                program = [A.Start(8, 0, 3), A.FuzzRequest((name,), 0, 8, 4), A.Steps(2), A.AbortUnknown()]
                path = Path(tmp) / f"{name}.py"
                path.write_text(A.to_source(program).text)
                if not server.alive:
                    server.shutdown()
                    server = ScriptedServer.start(topology=args.topology)
                t0 = time.monotonic()
                r = server.run(f"{path}:program", timeout=120)
                verdict = "PASS" if r.passed else ("CRASH" if r.crashed else "FAIL")
                results[name] = {"class": request_fuzz.BY_NAME[name].cls, "verdict": verdict, "error": r.error,
                                 "s": round(time.monotonic() - t0, 1)}
                print(f"{name:30s} {request_fuzz.BY_NAME[name].cls:9s} {verdict:5s} {(r.error or '')[:160]}",
                      flush=True)
        finally:
            server.shutdown()
    bad = {n: r for n, r in results.items() if r["verdict"] != "PASS"}
    print(f"{args.topology}: {len(results)} cases, {len(results) - len(bad)} pass, "
          f"{sum(1 for r in bad.values() if r['verdict'] == 'CRASH')} crash, "
          f"{sum(1 for r in bad.values() if r['verdict'] == 'FAIL')} fail")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
