"""Does a program give the same step trace whatever ran before it on the
server? The seed corpus, run twice on one server: in its order, then in a
shuffled order, each program's two traces compared as the explorer's
determinism check compares them; then the longest program of the suite's
ci exploration (``tests/server/test_explore.py``: the corpus and 15
derandomized programs, 1 at pp4), ``--repeats`` times in a row, each run against the
one before: each run of it starts after another count of everything the
scheduler counts.

    .venv/bin/python bench/history_determinism.py [--topologies pp1-normal,pp1-overlap,pp4] [--seed 1]
        [--limit N] [--repeats 30] [--out DIR]

The explorer replays a failure on a fresh server and checks determinism by
running a program twice on the server it searched on: both trust the engine
reset between programs to give back everything a fresh engine has
(``scheduler_side/reset_fingerprint.py``). A part the reset misses shows here
as a program whose trace depends on the programs before it. Per topology one
server (forked from the process template; with a registered race's
workaround and a registered bug's waived check where ``explore`` has them),
every check on; the programs
with session turns run once before both passes (their greedy references
are computed on first use and kept in the server's memory, on purpose:
``output_oracle.reference_entry``). Prints the programs that differ with
the first difference, and a table. Traces of the
programs that differ are kept under ``--out`` (none written without it).
"""
from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from stats import machine_line, md_table  # noqa: E402

from scripted_runtime.user_side.explore import corpus, determinism, explorer  # noqa: E402
from scripted_runtime.user_side.explore.explore_settings import ExploreSettings  # noqa: E402
from scripted_runtime.user_side.explore.runner import ExampleRunner  # noqa: E402
from scripted_runtime.user_side.server_config import ServerConfig  # noqa: E402


def measure(topology: str, *, seed: int, limit: int, repeats: int, work: Path, keep: Path = None) -> dict:
    programs = corpus.programs(topology)[:limit or None]
    print(f"[bench] {topology}: {len(programs)} corpus programs, twice", file=sys.stderr, flush=True)
    # as `explore` starts its servers: with the workaround of a registered race that ends programs
    config, worked_around = explorer.work_around_known(ServerConfig(topology), ExploreSettings(profile="ci"))
    if worked_around:
        print(f"[bench] {topology}: worked around: {', '.join(f'{p} ({n})' for p, n in worked_around.items())}",
              file=sys.stderr, flush=True)
    runner = ExampleRunner(config)
    t0 = time.monotonic()
    differ = []
    try:
        runner.ensure_server()
        # and with the checks off that a registered bug breaks on nearly every program there
        # (the pause check at pp4 on 0.5.23), as `explore` does
        runner.config, waived = explorer.waive_known_checks(runner.config, ExploreSettings(profile="ci"),
                                                            str(runner.info.get("sglang_version") or "?"))
        if waived:
            print(f"[bench] {topology}: waived: {', '.join(f'{c} ({n})' for c, n in waived.items())}",
                  file=sys.stderr, flush=True)
        # A session turn's greedy reference is computed by the first program that needs it and kept
        # in this server's memory (output_oracle.reference_entry, on purpose): run those programs once
        # before, so that both passes read it and only the engine's own state can differ.
        for _, program in programs:
            if any(type(a).__name__ == "Turn" for a in program):
                runner.run(program)
        first = {}
        for i, (_, program) in enumerate(programs):
            path = work / f"{topology}-{i:03d}-first.jsonl"
            first[i] = (runner.run(program, trace=path).signature, str(path))
        order = list(range(len(programs)))
        random.Random(seed).shuffle(order)
        for done, i in enumerate(order, 1):
            name, program = programs[i]
            path = work / f"{topology}-{i:03d}-second.jsonl"
            same, verdict = determinism.check_traces(first[i], (runner.run(program, trace=path).signature,
                                                                str(path)), topology=topology)
            if not same:
                verdict = _keep(verdict, (first[i][1], str(path)), work, keep)
                differ.append((i, name, verdict))
                print(f"[bench] {topology}: program {i} ({name}): {verdict}", file=sys.stderr, flush=True)
            if done % 50 == 0:
                print(f"[bench] {topology}: {done} of {len(programs)} compared", file=sys.stderr, flush=True)
        # The longest program of the suite's ci exploration (the corpus and 15 generated programs,
        # derandomized: the one its determinism check runs twice), run again and again: each run starts
        # after another number of iterations, prefill passes and requests than the one before.
        longest = _ci_longest(runner, work, 1 if topology == "pp4" else 15)
        repeats_differ = 0
        previous = None
        for k in range(repeats + 1):
            path = work / f"{topology}-longest-{k}.jsonl"
            again = (runner.run(longest, trace=path).signature, str(path))
            if previous is not None:
                same, verdict = determinism.check_traces(previous, again, topology=topology)
                if not same:
                    verdict = _keep(verdict, (previous[1], again[1]), work, keep)
                    repeats_differ += 1
                    print(f"[bench] {topology}: run {k} of the longest program: {verdict}", file=sys.stderr,
                          flush=True)
            previous = again
        restarts = runner.restarts
    finally:
        runner.close()
    return {"programs": len(programs), "differ": differ, "restarts": restarts, "s": time.monotonic() - t0,
            "longest": (len(longest), _steps(previous[1])), "repeats": repeats,
            "repeats_differ": repeats_differ}


def _keep(verdict: str, traces, work: Path, keep: Path = None) -> str:
    """Copy two traces that differ into ``keep`` (when given); the verdict
    then names the kept copies."""
    if keep is None:
        return verdict
    keep.mkdir(parents=True, exist_ok=True)
    for trace in traces:
        shutil.copy(trace, keep / Path(trace).name)
    return verdict.replace(str(work), str(keep))


def _ci_longest(runner: ExampleRunner, work: Path, examples: int) -> list:
    """The longest passing program of a ci-profile search of ``examples``
    programs after the corpus (``tests/server/test_explore.py``'s budget:
    15, 1 at pp4)."""
    from hypothesis import configuration as hypothesis_configuration

    from scripted_runtime.user_side.explore import search as search_mod

    home = hypothesis_configuration.storage_directory(intent_to_write=False).home_directory
    hypothesis_configuration.set_hypothesis_home_dir(work / ".hypothesis")  # nothing beside the caller
    try:
        result = search_mod.search(runner, ExploreSettings(profile="ci", max_examples=examples,
                                                           check_determinism=False))
    finally:
        hypothesis_configuration.set_hypothesis_home_dir(home)
    if result.longest_passing is None:
        raise SystemExit(f"the ci search found no passing program to repeat (failures: {result.stats.failures})")
    return result.longest_passing


def _steps(trace: str) -> int:
    with open(trace) as f:
        return sum(1 for _ in f) - 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topologies", default="pp1-normal,pp1-overlap,pp4")
    ap.add_argument("--seed", type=int, default=1, help="the second pass's order")
    ap.add_argument("--limit", type=int, default=0, help="only the first N corpus programs (0: all)")
    ap.add_argument("--repeats", type=int, default=30,
                    help="then run the ci search's longest program this many times in a row, each against the one before")
    ap.add_argument("--out", type=Path, default=None, help="keep the traces of the programs that differ here")
    args = ap.parse_args()
    started = machine_line()
    work = Path(tempfile.mkdtemp(prefix="history-determinism-"))
    try:
        results = {t: measure(t, seed=args.seed, limit=args.limit, repeats=args.repeats, work=work, keep=args.out)
                   for t in args.topologies.split(",")}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nThe corpus twice per server (its order, then shuffled with seed {args.seed}), {started}\n")
    rows = [[t, str(r["programs"]), str(len(r["differ"])),
             "; ".join(f"{i} {name}: {verdict.split(' (traces ')[0]}" for i, name, verdict in r["differ"]) or "-",
             f"{r['longest'][0]} actions, {r['longest'][1]} steps",
             f"{r['repeats_differ']} of {r['repeats']}", str(r["restarts"]), f"{r['s']:.0f}"]
            for t, r in results.items()]
    print(md_table(["topology", "programs", "differ after another history", "which, first difference",
                    "the ci search's longest program", "its runs in a row that differ from the run before", "restarts",
                    "time (s)"], rows))
    sys.exit(1 if any(r["differ"] or r["repeats_differ"] for r in results.values()) else 0)


if __name__ == "__main__":
    main()
