"""How long from a scheduler crash to the next program, with and without a
standby server, and what the standby costs in memory?

    .venv/bin/python bench/crash_restart.py [--topologies pp4,pp1-normal] [--repeat 3] [--standby off,on]

Per topology, an ``ExampleRunner`` (what ``explore`` uses) with
``--standby off`` and one with ``--standby on``, each with the output oracle
on (a restart reads its references from the reference cache the first
server wrote, in a directory of the run's own; a standby reads them before it
is needed). Each repeat runs a scenario that kills the scheduler (a real
SGLang 0.5.23 crash at pp=4, the known bug ``pp_retract_chunk_double_release``;
elsewhere ``crash_now`` below, which makes the event loop raise), then times a
one-request program: crash detected -> next program done. The standby's
memory is the RSS of its processes once ready (the live server's is the
same: a standby doubles it). Nothing else may run beside it.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CRASH = {"pp4": f"{ROOT / 'scenarios' / 'known_bugs.py'}:pp_retract_chunk_double_release"}
SABOTAGE = f"{Path(__file__).resolve()}:crash_now"
TARGET_S = 10.0


def crash_now(ctx):
    """A scenario (runs in the scheduler): the scheduler's next iteration raises."""
    def get_next_batch_to_run(*args, **kwargs):
        raise RuntimeError("crashed on purpose by bench/crash_restart.py")

    ctx.scheduler.get_next_batch_to_run = get_next_batch_to_run
    for _ in range(5):
        yield


def measure(topology: str, standby: str, repeat: int) -> dict:
    from proctree import rss_mib

    from scripted_runtime.user_side.explore import actions as A
    from scripted_runtime.user_side.explore.runner import ExampleRunner
    from scripted_runtime.user_side.server_config import ServerConfig

    def progress(line: str) -> None:
        print(f"[bench] {topology} standby={standby}: {line}", file=sys.stderr, flush=True)

    runner = ExampleRunner(ServerConfig(topology), standby=standby, progress=progress)
    times, standby_mib = [], []
    try:
        runner.ensure_server()
        for i in range(repeat):
            standby = runner.standby
            if standby is not None:
                if not standby.wait_ready(600):
                    raise RuntimeError(f"standby not ready within 600 s: {standby.error or 'still starting'}")
                standby_mib.append(rss_mib(standby.server.pids()))
            crashed = runner.server.run(CRASH.get(topology, SABOTAGE), timeout=120)
            if not crashed.crashed:
                raise RuntimeError(f"the crash scenario did not crash the scheduler: {crashed.summary()}")
            t0 = time.monotonic()
            outcome = runner.run([A.Start(8, 1, 2)])
            times.append(time.monotonic() - t0)
            if outcome.failed:
                raise RuntimeError(f"the program after the crash failed: {outcome.signature}")
            progress(f"repeat {i + 1}/{repeat}: crash -> next program done in {times[-1]:.1f}s")
        live_mib = rss_mib(runner.server.pids())
    finally:
        runner.close()
    return {"times": times, "standby_mib": standby_mib, "live_mib": live_mib, "swaps": runner.swaps,
            "version": runner.info.get("sglang_version") if runner.server else None}


def main() -> None:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    from stats import machine_line, md_table, spread

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topologies", default="pp4,pp1-normal")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--standby", default="off,on", help="the standby modes to measure (default: off,on)")
    args = ap.parse_args()
    # The output oracle's reference cache in a directory of this run's own: the first server
    # computes the references and writes them, every restart reads them (what a user's second
    # server gets), whatever an earlier run left in ~/.cache.
    import atexit
    import os
    import shutil
    import tempfile

    if "SCRIPTED_RUNTIME_REFERENCE_CACHE" not in os.environ:
        own = tempfile.mkdtemp(prefix="bench-references-")
        atexit.register(shutil.rmtree, own, True)
        os.environ["SCRIPTED_RUNTIME_REFERENCE_CACHE"] = own
    rows = []
    for topology in args.topologies.split(","):
        for mode in args.standby.split(","):
            r = measure(topology, mode, args.repeat)
            ok = "met" if statistics.median(r["times"]) <= TARGET_S else "MISSED"
            rows.append([topology, mode, spread(r["times"], "{:.1f}"), f"<= {TARGET_S:.0f} ({ok})",
                         str(r["swaps"]), f"{r['live_mib']:.0f}",
                         spread(r["standby_mib"], "{:.0f}") if r["standby_mib"] else "-"])
    print(f"\ncrash -> next program, {args.repeat} crashes per row ({machine_line()}):\n")
    print(md_table(["topology", "standby", "crash -> next program done (s)", "target (s)", "swaps",
                    "live server RSS (MiB)", "standby RSS (MiB)"], rows))


if __name__ == "__main__":
    main()
