"""Does novelty guidance reach more scheduler states in the same time?

    .venv/bin/python bench/novelty.py [--topology pp1-overlap] [--minutes 5] [--seed 1] [--out bench-novelty]
                                      [--no-corpus]
    .venv/bin/python bench/novelty.py --from-json GUIDED.json UNGUIDED.json   # the table of two earlier runs

Runs ``scripted-runtime explore`` twice on one topology, one after the
other (one server at a time), with the same seed and time budget (the dev
profile, its program count lifted so the time binds): guided by novelty
(the default) and with ``--no-novelty``. Each writes its statistics
(``--stats-json``) under ``--out``; the table compares the distinct
abstract states (``scheduler_side/abstract_state.py``) reached by 1, 2 and
5 minutes, in all, and the programs run. A run that found a new failure
stops there (its row says so). The seed corpus runs first in both, outside
the budget, unless ``--no-corpus``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from stats import machine_line, md_table  # noqa: E402

# explore's flags for each topology
TOPOLOGY_FLAGS = {"pp1-overlap": ["--pp", "1", "--overlap"], "pp1-normal": ["--pp", "1", "--no-overlap"],
                  "pp4": ["--pp", "4"], "pp1-hicache": ["--topology", "pp1-hicache"]}
MARKS_MIN = (1, 2, 5)  # the table's columns: states reached by these minutes
RUNS = (("guided", ["--novelty"]), ("unguided (--no-novelty)", ["--no-novelty"]))
EXAMPLES_UNBOUNDED = 10**9  # the time budget binds, not the program count


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topology", default="pp1-overlap", choices=sorted(TOPOLOGY_FLAGS))
    ap.add_argument("--minutes", type=float, default=5.0, help="search time of each run (server start excluded)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="bench-novelty", help="each run's --out and statistics go here")
    ap.add_argument("--no-corpus", action="store_true", help="both runs without the seed corpus")
    ap.add_argument("--from-json", nargs=2, metavar=("GUIDED", "UNGUIDED"),
                    help="print the table of two earlier runs' --stats-json files; run nothing")
    args = ap.parse_args(argv)
    if args.minutes <= 0:
        ap.error("--minutes must be > 0")
    return args


def explore_command(args: argparse.Namespace, label: str, extra: List[str]) -> List[str]:
    """The ``scripted-runtime explore`` command line of one run."""
    slug = label.split()[0]
    out = Path(args.out).resolve()
    return ([sys.executable, "-m", "scripted_runtime.user_side.cli", "explore", *TOPOLOGY_FLAGS[args.topology],
             "--profile", "dev", "--seed", str(args.seed), "--max-time", f"{args.minutes * 60:g}",
             "--max-examples", str(EXAMPLES_UNBOUNDED), "--no-determinism-check", "--database", "none",
             "--out", str(out / slug), "--stats-json", str(out / f"{slug}.json")]
            + (["--no-corpus"] if args.no_corpus else []) + extra)


def load_stats(path: Path) -> dict:
    """The statistics of a ``--stats-json`` file (ValueError if the run did not run)."""
    data = json.loads(Path(path).read_text())
    if data.get("status") != "RAN":
        raise ValueError(f"{path}: the run did not run ({data.get('status')}: {data.get('error')})")
    return {**data["stats"], "failed": data.get("signature")}


def states_by(stats: dict, minutes: float) -> str:
    """Distinct states reached by ``minutes`` into the search; ``-`` past the run's end."""
    if stats.get("wall_s", 0.0) < 60.0 * minutes - 1.0:  # a second of slack: the budget ends the search
        return "-"
    return str(sum(1 for at in stats.get("states", {}).values() if at <= 60.0 * minutes))


def table(rows: List[tuple]) -> str:
    """One line per run: (label, its statistics)."""
    header = (["run"] + [f"states at {m} min" for m in MARKS_MIN]
              + ["states in all", "programs run", "novel programs", "mutated from them", "search (s)"])
    lines = []
    for label, st in rows:
        note = f" (stopped: {st['failed']})" if st.get("failed") else ""
        lines.append([label + note] + [states_by(st, m) for m in MARKS_MIN]
                     + [str(len(st.get("states", {}))), str(st.get("examples", 0)), str(st.get("novel_programs", 0)),
                        str(st.get("guided_programs", 0)) if st.get("novelty") else "-", f"{st.get('wall_s', 0):.0f}"])
    return md_table(header, lines)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        rows = [(label, load_stats(Path(path))) for (label, _), path in zip(RUNS, args.from_json)]
        print(table(rows))
        return 0
    Path(args.out).mkdir(parents=True, exist_ok=True)
    rows = []
    for label, extra in RUNS:
        cmd = explore_command(args, label, extra)
        print(f"[bench] {label}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        subprocess.run(cmd, check=False)  # exit 1 (a failure found) still wrote its statistics
        rows.append((label, load_stats(Path(cmd[cmd.index("--stats-json") + 1]))))
    print(f"\nnovelty guidance on {args.topology}, {args.minutes:g} min each, seed {args.seed} ({machine_line()}):\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
