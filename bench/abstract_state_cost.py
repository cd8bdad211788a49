"""What does the abstract state (the explorer's novelty feedback) cost per iteration?

    .venv/bin/python bench/abstract_state_cost.py [--calls 100000] [--repeat 5]

Runs ``AbstractStates.observe`` (``scheduler_side/abstract_state.py``) on the
busy stand-in scheduler of the logic tests (``tests/fakes.py``: four running
requests, two waiting, a chunked prefill between chunks, two PP slots holding
a batch) ``--calls`` times, ``--repeat`` rounds, and prints the best and the
median round as microseconds per call. It runs only for the explorer's
programs, once per iteration, after the script yielded; a stand-in in a warm
loop is a floor: inside the scheduler the same calls run right after a
forward, on cold caches (``bench/iteration_cost.py`` measures there). No
SGLang process.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from scripted_runtime.scheduler_side import abstract_state as AS  # noqa: E402
from tests.fakes import busy_scheduler  # noqa: E402

import stats  # noqa: E402  (bench/stats.py: the machine line)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=100_000, help="calls per round (default 100000)")
    ap.add_argument("--repeat", type=int, default=5, help="rounds (default 5)")
    args = ap.parse_args(argv)
    if args.calls < 1 or args.repeat < 1:
        ap.error("--calls and --repeat must be at least 1")
    s = busy_scheduler()
    states = AS.AbstractStates()
    states.begin(True)
    rounds = [t / args.calls * 1e6 for t in timeit.repeat(lambda: states.observe(s, ()), number=args.calls,
                                                                 repeat=args.repeat)]
    print(stats.machine_line())
    print(f"state key on the stand-in: {states.keys()[0]}")
    print("| piece | us per iteration, best | median of rounds |")
    print("|---|---|---|")
    print(f"| AbstractStates.observe, busy stand-in, {args.calls} calls x {args.repeat} | "
          f"{min(rounds):.2f} | {statistics.median(rounds):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
