"""The harness side by side with SGLang's plain engine and SGLang's own
built-in harness, in one run, on this machine and the installed release.

    .venv/bin/python bench/compare.py [--topologies pp1-overlap,pp4] [--repeat 3]
        [--decode-steps 400] [--short-runs 20] [--explore-seconds 30] [--json out.json]

Systems, each started fresh in its own process for every repeat (order
rotated between repeats), with the same engine arguments and CPU enablement:

* ``harness``  - ours (``ScriptedServer``), run as ``scripted-runtime run`` does;
* ``upstream`` - SGLang's built-in ``sglang.test.scripted_runtime`` harness
  (``ScriptedHttpServer``), its KV canary off and its tree-core inspectors
  left out (neither works on CPU; ``hooks/upstream_harness.py``);
* ``server``   - plain ``launch_server`` (HTTP, the same launch path as ours,
  no scheduler hook), ready when ``/health`` says its warmup was served;
* ``engine``   - plain in-process ``sglang.Engine`` (no HTTP server, no warmup).

Per system and repeat: start to first script (from before any SGLang
import), a decode of ``--decode-steps`` scheduler iterations (at pp=4 one
iteration is one microbatch slot and a lone request gets a token every
pp_size + pp_async_batch_depth slots, so the request asks for that many fewer
tokens), ``--short-runs`` runs of a short script (reset + a 100-token chunked
prefill + 2 tokens; for the plain systems the same request alone), shutdown
time, processes left (right after shutdown returns, and after the process
exits), and the peak memory of the whole process tree (sum of RSS, and of
PSS, which counts shared pages once), sampled every 0.25 s. Our harness also
decodes with invariants off (``bare``) and invariants on without the step
trace. Then ``--explore-seconds`` of exploration per topology and repeat.

Ratios are taken within one repeat (the systems ran minutes apart on the same
machine) and reported as median and min..max over repeats.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import queue
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hooks import sglang_compat  # noqa: E402
from scripted_runtime import engine_config  # noqa: E402

SYSTEMS = ("harness", "upstream", "server", "engine")
LABELS = {"harness": "harness", "upstream": "upstream harness", "server": "plain launch_server",
          "engine": "plain Engine"}
CHILD_TIMEOUT_S = 1200.0
SAMPLE_EVERY_S = 0.25
PAGE = os.sysconf("SC_PAGE_SIZE")


# --- the process tree of one child ----------------------------------------------
def _stat(pid: int) -> Optional[Tuple[int, str, int]]:
    """(ppid, state, start time in ticks) of a process, None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            rest = f.read().rsplit(b") ", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(rest[1]), rest[0].decode(), int(rest[19])


def descendants(root: int) -> Dict[int, int]:
    """pid -> start time of ``root`` and every live process below it."""
    children: Dict[int, List[int]] = {}
    starts: Dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = _stat(int(name))
        if st is None or st[1] == "Z":
            continue
        children.setdefault(st[0], []).append(int(name))
        starts[int(name)] = st[2]
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in starts:
            out[pid] = starts[pid]
        todo.extend(children.get(pid, ()))
    return out


def alive(seen: Dict[int, int], exclude: int) -> List[int]:
    """Processes of ``seen`` still running (same pid, same start time)."""
    left = []
    for pid, start in seen.items():
        st = _stat(pid)
        if pid != exclude and st is not None and st[1] != "Z" and st[2] == start:
            left.append(pid)
    return sorted(left)


def memory_mib(pids) -> Tuple[float, float]:
    rss = pss = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                rss += int(f.read().split()[1]) * PAGE
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError, IndexError):
            continue
    return rss / 2**20, pss / 2**20


class TreeSampler(threading.Thread):
    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.seen: Dict[int, int] = {}
        self.peak_rss = self.peak_pss = 0.0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            tree = descendants(self.root)
            self.seen.update(tree)
            rss, pss = memory_mib(tree)
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
            self._stop_event.wait(SAMPLE_EVERY_S)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)


def kill_all(pids: List[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, 9)
        except (ProcessLookupError, PermissionError):
            pass


def run_child(system: str, topology: str, decode_tokens: int, short_runs: int) -> dict:
    """Run one system in a fresh process; returns its report plus tree figures."""
    cmd = [sys.executable, str(ROOT / "bench" / "compare_child.py"), system, topology, str(decode_tokens),
           str(short_runs)]
    stderr_path = Path(f"/tmp/bench-compare-{system}-{topology}-{os.getpid()}.log")
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                text=True, start_new_session=True)
    sampler = TreeSampler(proc.pid)
    sampler.start()
    lines: "queue.Queue[Optional[str]]" = queue.Queue()

    def reader() -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=reader, daemon=True).start()
    report: dict = {}
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    try:
        while True:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"{system} on {topology} did not finish within {CHILD_TIMEOUT_S:.0f}s "
                                   f"(reported so far: {sorted(report)}; log {stderr_path})")
            if line is None:
                break
            if not line.startswith("@@ "):
                continue
            msg = json.loads(line[3:])
            event = msg.pop("event")
            if event == "shutdown":
                # what is still running right after shutdown() returned
                report["left_after_shutdown"] = alive({**sampler.seen, **descendants(proc.pid)}, proc.pid)
                proc.stdin.write("go\n")
                proc.stdin.flush()
            report.update(msg)
            print(f"[bench]   {system} {topology} {event}: "
                  + ", ".join(f"{k}={v:.2f}" for k, v in msg.items() if isinstance(v, float)),
                  file=sys.stderr, flush=True)
        code = proc.wait(timeout=60)
        if code != 0 or "decode" not in report:
            raise RuntimeError(f"{system} on {topology} failed (exit {code}); log {stderr_path}:\n"
                               + stderr_path.read_text(errors="replace")[-3000:])
    finally:
        if proc.poll() is None:
            kill_all(list(descendants(proc.pid)))
            proc.wait(timeout=10)
        sampler.stop()
    time.sleep(1.0)
    left = alive(sampler.seen, proc.pid)
    report["left_after_exit"] = left
    kill_all(left)  # keep the next system's figures clean
    report["peak_rss_mib"], report["peak_pss_mib"] = sampler.peak_rss, sampler.peak_pss
    stderr_path.unlink(missing_ok=True)
    return report


# --- statistics ---------------------------------------------------------------------
def decode_tokens_for(topology: str, steps: int) -> int:
    kwargs = engine_config.engine_kwargs("cpu", topology)
    pp = kwargs.get("pp_size", 1)
    per_token = 1 if pp == 1 else pp + kwargs.get("pp_async_batch_depth", 0)
    return max(2, math.ceil(steps / per_token))


def spread(values: List[float], fmt: str = "{:.2f}") -> str:
    if not values:
        return "n/a"
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} ({fmt.format(min(values))}..{fmt.format(max(values))})"


def ratio(a: List[float], b: List[float]) -> List[float]:
    return [x / y for x, y in zip(a, b) if y]


def collect(runs: List[dict], system: str, topology: str, key) -> List[float]:
    out = []
    for run in runs:
        rep = run.get((system, topology))
        if rep is None:
            continue
        try:
            out.append(key(rep))
        except (KeyError, TypeError, ZeroDivisionError):
            pass
    return out


def per_repeat(runs, a_sys, b_sys, topology, key_a, key_b=None) -> List[float]:
    """Ratios a/b within each repeat where both ran."""
    key_b = key_b or key_a
    out = []
    for run in runs:
        ra, rb = run.get((a_sys, topology)), run.get((b_sys, topology))
        if ra is None or rb is None:
            continue
        try:
            out.append(key_a(ra) / key_b(rb))
        except (KeyError, TypeError, ZeroDivisionError):
            pass
    return out


def tokens_per_s(config: str):
    return lambda rep: rep["decode"][config]["tokens"] / rep["decode"][config]["wall_s"]


def steps_per_s(config: str):
    return lambda rep: rep["decode"][config]["steps"] / rep["decode"][config]["wall_s"]


def short_median(config: str):
    return lambda rep: statistics.median(rep["short"][config])


def harness_tps(rep: dict) -> float:
    return tokens_per_s("default")(rep)


def plain_tps(rep: dict) -> float:
    return tokens_per_s("plain")(rep)


# --- the table ------------------------------------------------------------------------
def table(runs: List[dict], topologies: List[str], explore: Dict[str, List[float]], args) -> str:
    rows = ["| topology | figure | harness | upstream harness | plain launch_server | plain Engine | "
            "harness / launch_server | harness / Engine | harness / upstream | target |",
            "|---|---|---|---|---|---|---|---|---|---|"]

    def row(topology, figure, key_by_system, fmt="{:.2f}", target="", ratio_key=None):
        cells = [spread(collect(runs, s, topology, key_by_system[s]), fmt) if s in key_by_system else ""
                 for s in SYSTEMS]
        ratios = []
        for other in ("server", "engine", "upstream"):
            if "harness" in key_by_system and other in key_by_system:
                r = per_repeat(runs, "harness", other, topology, key_by_system["harness"],
                               key_by_system[other])
                ratios.append(spread(r, "{:.2f}x") if r else "n/a")
            else:
                ratios.append("")
        rows.append(f"| {topology} | {figure} | " + " | ".join(cells) + " | " + " | ".join(ratios)
                    + f" | {target} |")

    for t in topologies:
        start = {s: (lambda rep: rep["start_s"]) for s in SYSTEMS}
        row(t, "start to first script (s)", start, "{:.1f}", "<= 1.1x plain")
        row(t, f"decode tokens/s ({args.decode_steps}-step script)",
            {"harness": harness_tps, "upstream": tokens_per_s("default"), "server": plain_tps,
             "engine": plain_tps}, "{:.1f}", ">= 0.95x plain")
        row(t, "decode steps/s (scheduler iterations)",
            {"harness": steps_per_s("default"), "upstream": steps_per_s("default")}, "{:.1f}")
        for config, label in (("bare", "invariants off, no trace"), ("invariants", "invariants on, no trace")):
            row(t, f"decode tokens/s, harness {label}",
                {"harness": tokens_per_s(config), "server": plain_tps, "engine": plain_tps}, "{:.1f}")
        inv_cost = per_repeat(runs, "harness", "harness", t, tokens_per_s("default"), tokens_per_s("bare"))
        inv_only = per_repeat(runs, "harness", "harness", t, tokens_per_s("invariants"), tokens_per_s("bare"))
        rows.append(f"| {t} | harness decode rate, invariants on / off | {spread(inv_only, '{:.2f}x')} (no trace), "
                    f"{spread(inv_cost, '{:.2f}x')} (with trace) | | | | | | | |")
        row(t, f"per-script overhead: reset + short script, median of {args.short_runs} (s)",
            {"harness": short_median("default"), "upstream": short_median("default"),
             "server": short_median("plain"), "engine": short_median("plain")}, "{:.3f}",
            "<= upstream")
        row(t, "  the same, harness invariants off and no trace (s)",
            {"harness": short_median("bare"), "upstream": short_median("default")}, "{:.3f}")
        row(t, "shutdown (s)", {s: (lambda rep: rep["shutdown_s"]) for s in SYSTEMS}, "{:.2f}",
            "<= upstream, < 5 s")
        row(t, "processes left right after shutdown",
            {s: (lambda rep: float(len(rep["left_after_shutdown"]))) for s in SYSTEMS}, "{:.0f}")
        row(t, "processes left after the process exited",
            {s: (lambda rep: float(len(rep["left_after_exit"]))) for s in SYSTEMS}, "{:.0f}", "0")
        row(t, "peak RSS of the process tree (MiB)", {s: (lambda rep: rep["peak_rss_mib"]) for s in SYSTEMS},
            "{:.0f}")
        row(t, "peak PSS of the process tree (MiB)", {s: (lambda rep: rep["peak_pss_mib"]) for s in SYSTEMS},
            "{:.0f}")
        if t in explore:
            rows.append(f"| {t} | exploration programs/min ({args.explore_seconds:.0f} s runs) | "
                        f"{spread(explore[t], '{:.0f}')} | n/a (no explorer) | | | | | | |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topologies", default="pp1-overlap,pp4")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--decode-steps", type=int, default=400)
    ap.add_argument("--short-runs", type=int, default=20)
    ap.add_argument("--explore-seconds", type=float, default=30.0, help="0 skips the exploration rows")
    ap.add_argument("--json", help="also write every raw figure to this file")
    args = ap.parse_args()
    topologies = args.topologies.split(",")
    systems = [s for s in args.systems.split(",") if s]
    for name in topologies:
        engine_config.engine_kwargs("cpu", name)  # a bad topology fails here, not after minutes
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        ap.error(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")

    t_all = time.monotonic()
    runs: List[dict] = []
    for i in range(args.repeat):
        run: dict = {}
        order = systems[i % len(systems):] + systems[:i % len(systems)]
        for t in topologies:
            tokens = decode_tokens_for(t, args.decode_steps)
            for system in order:
                print(f"[bench] repeat {i + 1}/{args.repeat}, {t}, {LABELS[system]} "
                      f"({time.monotonic() - t_all:.0f}s in)", file=sys.stderr, flush=True)
                run[(system, t)] = run_child(system, t, tokens, args.short_runs)
        runs.append(run)

    explore: Dict[str, List[float]] = {}
    if args.explore_seconds > 0:
        sys.path.insert(0, str(ROOT / "bench"))
        import explore as explore_bench

        for t in topologies:
            explore[t] = explore_bench.measure(t, args.explore_seconds, args.repeat)["rates"]

    print(f"\n{time.strftime('%Y-%m-%d')}, sglang {sglang_compat.installed_sglang_version()}, "
          f"{os.cpu_count()} cores ({platform.machine()}), tiny Qwen2 on CPU, {args.repeat} repeats, "
          f"median (min..max); {time.monotonic() - t_all:.0f} s in all\n")
    print(table(runs, topologies, explore, args))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"runs": [{f"{s}/{t}": rep for (s, t), rep in run.items()} for run in runs], "explore": explore},
            indent=1))


if __name__ == "__main__":
    main()
