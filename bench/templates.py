"""A server in seconds (issue 36): start to first script from a process
template, against a spawned harness server and plain ``launch_server``
started the ordinary way, side by side in one run; and what a template costs
in memory.

    .venv/bin/python bench/templates.py [--topologies pp1-overlap,pp4] [--repeat 3]

Per topology and repeat, in turn (order rotated between repeats):

* ``plain``: SGLang's ``launch_server`` without our hook, spawned as an
  operator would (``compare_child.PlainServer``), until ``/health`` answers;
* ``spawned``: a harness server with ``SCRIPTED_RUNTIME_TEMPLATES=off``, until
  its first script (one iteration) is done;
* ``cold``: the same from a template this process has not started yet (the
  first server of a build: the template's imports are on the clock);
* ``warm``: the same from the template the ``cold`` start left running (every
  later server of the process: the pytest plugin's pool, ``explore``'s
  restarts, ``mutate``'s rows);
* ``child``: a child process of this one (``python -c``: the harness
  imported, a server started, its first script run), forking its server from
  this process's template (``SCRIPTED_RUNTIME_TEMPLATE_SHARE``: an ``ab``
  side, an ``explore -n`` worker, a command a test runs), timed from the
  child's start; its template's PSS is this process's (not counted again).

Memory, read once each server is up and quiet: PSS summed over the server's
processes (shared pages split between the processes that map them, so a
forked tree's shared imports count once), and for ``warm`` the template's PSS
added. RSS is printed too (each process's shared pages counted in full).

The output oracle's references come from a reference cache of the run's
own, written by the first server of each topology (before the timed
repeats), as for any later server of a user's. Nothing else may run beside it.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 300.0
MODES = ("plain", "spawned", "cold", "warm", "child")
CHILD = """
import sys, time
sys.path.insert(0, sys.argv[3])  # bench/, not on PYTHONPATH: that is part of the template's environment
from scripted_runtime import ScriptedServer
server = ScriptedServer.start(topology=sys.argv[1], start_timeout_s=300)
result = server.run(sys.argv[2])
assert result.passed and server.template_shared, (result.summary(), server.origin)
print("FIRST-SCRIPT-DONE", flush=True)
from proctree import memory_mib
time.sleep(1.0)
rss, pss = memory_mib(server.pids())
print("MEMORY", rss, pss, server.info.get("sglang_version"), flush=True)
server.shutdown()
"""


def one_step(ctx):
    """The first script: one scheduler iteration."""
    yield


def _harness(topology: str, mode: str) -> dict:
    from proctree import memory_mib

    from scripted_runtime import ScriptedServer
    from scripted_runtime.user_side import templates

    os.environ[templates.ENV_TEMPLATES] = "off" if mode == "spawned" else "on"
    if mode == "cold":
        templates.close_all()
    t0 = time.monotonic()
    server = ScriptedServer.start(topology=topology, start_timeout_s=START_TIMEOUT_S)
    try:
        result = server.run(f"{Path(__file__).resolve()}:one_step")
        start_s = time.monotonic() - t0
        if not result.passed:
            raise RuntimeError(f"{mode}: the first script failed: {result.summary()}")
        if server.forked != (mode != "spawned"):
            raise RuntimeError(f"{mode}: expected a {'spawned' if mode == 'spawned' else 'forked'} server")
        time.sleep(1.0)  # quiet
        rss, pss = memory_mib(server.pids())
        template_pss = 0.0
        if mode in ("cold", "warm"):
            (template,) = templates.running()
            _, template_pss = memory_mib([template.pid])
        return {"start_s": start_s, "rss_mib": rss, "pss_mib": pss, "template_pss_mib": template_pss,
                "version": server.info.get("sglang_version")}
    finally:
        server.shutdown()


def _child(topology: str) -> dict:
    import subprocess

    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, topology, f"{Path(__file__).resolve()}:one_step",
                             str(ROOT / "bench")], stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
    start_s, memory = None, None
    for line in proc.stdout:
        if line.startswith("FIRST-SCRIPT-DONE"):
            start_s = time.monotonic() - t0
        elif line.startswith("MEMORY"):
            memory = line.split()
    if proc.wait(timeout=120) != 0 or start_s is None or memory is None:
        raise RuntimeError(f"child: exited {proc.returncode} before its first script and memory line")
    return {"start_s": start_s, "rss_mib": float(memory[1]), "pss_mib": float(memory[2]), "template_pss_mib": 0.0,
            "version": memory[3]}


def _plain(topology: str) -> dict:
    from compare_child import PlainServer
    from proctree import memory_mib

    t0 = time.monotonic()
    server = PlainServer(topology)
    try:
        server.wait_healthy(t0 + START_TIMEOUT_S)
        start_s = time.monotonic() - t0
        time.sleep(1.0)
        rss, pss = memory_mib(server.pids())
        return {"start_s": start_s, "rss_mib": rss, "pss_mib": pss, "template_pss_mib": 0.0}
    finally:
        server.stop()


def measure(topology: str, repeat: int, progress) -> dict:
    from stats import rotated

    from scripted_runtime import ScriptedServer

    os.environ["SCRIPTED_RUNTIME_TEMPLATES"] = "on"
    warmup = ScriptedServer.start(topology=topology, start_timeout_s=START_TIMEOUT_S)  # writes the references
    warmup.run(f"{Path(__file__).resolve()}:one_step")
    warmup.shutdown()
    out = {m: [] for m in MODES}
    for i in range(repeat):
        # warm and child right after cold, on the template cold started
        order = [m for turn in rotated(["plain", "spawned", "cold"], i) for m in
                 (("cold", "warm", "child") if turn == "cold" else (turn,))]
        for mode in order:
            fig = (_plain(topology) if mode == "plain" else _child(topology) if mode == "child"
                   else _harness(topology, mode))
            out[mode].append(fig)
            progress(f"{topology} repeat {i + 1}/{repeat} {mode}: start {fig['start_s']:.1f}s, "
                     f"PSS {fig['pss_mib'] + fig['template_pss_mib']:.0f} MiB")
    return out


def main() -> None:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    from stats import machine_line, md_table, spread

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topologies", default="pp1-overlap,pp4")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    cache = tempfile.mkdtemp(prefix="bench-templates-refs-")
    os.environ["SCRIPTED_RUNTIME_REFERENCE_CACHE"] = cache

    def progress(line: str) -> None:
        print(f"[bench] {line}", file=sys.stderr, flush=True)

    rows, version = [], None
    for topology in args.topologies.split(","):
        figs = measure(topology, args.repeat, progress)
        version = version or next((f.get("version") for f in figs["warm"] if f.get("version")), None)
        plain = [f["start_s"] for f in figs["plain"]]
        for mode in MODES:
            starts = [f["start_s"] for f in figs[mode]]
            ratios = [s / p for s, p in zip(starts, plain)]
            pss = [f["pss_mib"] + f["template_pss_mib"] for f in figs[mode]]
            rows.append([topology, mode, spread(starts, "{:.1f}"), spread(ratios, "{:.2f}x"),
                         spread(pss, "{:.0f}"), spread([f["template_pss_mib"] for f in figs[mode]], "{:.0f}"),
                         spread([f["rss_mib"] for f in figs[mode]], "{:.0f}")])
    print(machine_line(version))
    print(md_table(["topology", "server", "start to first script (s)", "/ plain launch_server",
                    "PSS, template included (MiB)", "of it the template (MiB)", "RSS of the server (MiB)"], rows))
    import shutil

    shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
