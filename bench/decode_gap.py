"""Where the harness's decode time goes, against a plain launch_server.

    .venv/bin/python bench/decode_gap.py [--topology pp1-overlap] [--tokens 400] [--rounds 9]

Two process trees stay up side by side, one thawed at a time (the other
SIGSTOPped: an idle SGLang scheduler spins on a core), with one untimed
second to settle after each switch: a plain ``launch_server`` and our
harness's server. The same 400-token decode of one request is timed four
ways, in an order rotated every round:

* ``plain``: ``/generate`` over HTTP to the plain server;
* ``harness, free-running``: ``/generate`` over HTTP to our server while a
  probe script (``bench/probe_scripts.py``) lets its scheduler run its own
  loop: the driver is skipped, only the hooks' thin wrappers remain. What
  our server costs before any script is stepped;
* ``harness, bare script``: the decode script (``compare_scripts.decode``)
  stepped one yield per iteration, invariants off, no trace;
* ``harness, default script``: the same with invariants and trace (what
  ``scripted-runtime run`` does).

Prints each figure's median (min..max) and its ratio to ``plain`` within
each round (median, min..max over rounds), against the decode target of
issue 6 (>= 0.95x plain).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, List

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import compare_child  # noqa: E402  (the plain server's arguments and environment)
import compare_scripts  # noqa: E402
import probe_scripts  # noqa: E402
import requests  # noqa: E402

from scripted_runtime import ScriptedServer, processes, protocol  # noqa: E402
from scripted_runtime.server import free_port  # noqa: E402

SETTLE_S = 1.0
START_TIMEOUT_S = 600.0
POST_TIMEOUT_S = 120.0
FIGURES = ("plain", "harness, free-running", "harness, bare script", "harness, default script")
TARGET = 0.95


class PlainServer:
    """launch_server without our scheduler hook, as bench/compare.py starts it."""

    def __init__(self, topology: str) -> None:
        kwargs = compare_child.engine_kwargs(topology)
        port = free_port()
        kwargs.update(host="127.0.0.1", port=port)
        self.url = f"http://127.0.0.1:{port}"
        self.server_id = uuid.uuid4().hex
        env = compare_child.sglang_env(kwargs)
        env["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] = "0"
        env[protocol.ENV_SERVER_ID] = self.server_id
        env[protocol.ENV_HARNESS_PID] = str(os.getpid())
        self.log = tempfile.NamedTemporaryFile(prefix="decode-gap-plain-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([sys.executable, "-m", "scripted_runtime.launch", json.dumps(kwargs)],
                                     env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, cwd=str(ROOT))
        self.start = processes.start_time(self.proc.pid)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"plain launch_server exited with {self.proc.returncode}; log {self.log.name}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"plain launch_server not healthy within {START_TIMEOUT_S:.0f}s; "
                                   f"log {self.log.name}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)

    def pids(self) -> List[int]:
        return processes.pids_of_server(self.server_id, self.proc.pid, self.start)

    def stop(self) -> None:
        left = processes.kill_server(self.server_id, self.proc.pid, pgid_start=self.start)
        self.proc.wait(timeout=10)
        if left:
            raise RuntimeError(f"plain launch_server processes survived SIGKILL: {left}")


def generate(url: str, tokens: int) -> float:
    """One non-streamed /generate of ``tokens`` tokens; its wall time."""
    t = time.monotonic()
    resp = requests.post(url + "/generate", json={
        "input_ids": [1] * compare_scripts.DECODE_PROMPT_LEN,
        "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}, timeout=POST_TIMEOUT_S)
    resp.raise_for_status()
    got = len(resp.json()["output_ids"])
    if got != tokens:
        raise RuntimeError(f"/generate at {url} returned {got} tokens, asked for {tokens}")
    return time.monotonic() - t


def signal_all(pids: List[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def measure(topology: str, tokens: int, rounds: int) -> Dict[str, List[float]]:
    print(f"[bench] {topology}: starting the plain launch_server...", file=sys.stderr, flush=True)
    plain = PlainServer(topology)
    harness = None
    frozen: Dict[str, List[int]] = {}
    try:
        generate(plain.url, 8)  # warm up
        signal_all(plain.pids(), signal.SIGSTOP)
        frozen["plain"] = plain.pids()
        print(f"[bench] {topology}: starting the harness...", file=sys.stderr, flush=True)
        harness = ScriptedServer.start(topology=topology)
        harness_url = harness.run(probe_scripts.http_url, invariants=False, trace=False).raise_if_failed().value
        harness.run(compare_scripts.short).raise_if_failed()  # warm up
        out = tempfile.mktemp(suffix=".json")
        live = ["harness"]
        trees = {"plain": plain.pids, "harness": harness.pids}

        def thaw(tree: str) -> None:
            if live[0] == tree:
                return
            pids = trees[live[0]]()
            signal_all(pids, signal.SIGSTOP)
            frozen[live[0]] = pids
            signal_all(frozen.pop(tree), signal.SIGCONT)
            live[0] = tree
            time.sleep(SETTLE_S)

        def script_decode(**config) -> float:
            harness.run(compare_scripts.decode, tokens, out, timeout=POST_TIMEOUT_S, **config).raise_if_failed()
            with open(out) as f:
                return json.load(f)["wall_s"]

        def free_running() -> float:
            took: Dict[str, float] = {}

            def post() -> None:
                time.sleep(0.3)  # the probe script is running by then
                try:
                    took["wall_s"] = generate(harness_url, tokens)
                except Exception as exc:  # noqa: BLE001 - reported below
                    took["error"] = repr(exc)

            poster = threading.Thread(target=post, daemon=True)
            poster.start()
            # Enough for the decode at a fifth of this box's usual rate.
            harness.run(probe_scripts.free_run, 0.3 + 5 * tokens * 0.0017 + 1.0,
                        invariants=False, trace=False, timeout=POST_TIMEOUT_S).raise_if_failed()
            poster.join(timeout=POST_TIMEOUT_S)
            if "wall_s" not in took:
                raise RuntimeError(f"the /generate during the free run did not finish: {took or 'still running'}")
            return took["wall_s"]

        runs: Dict[str, Callable[[], float]] = {
            "plain": lambda: (thaw("plain"), generate(plain.url, tokens))[1],
            "harness, free-running": lambda: (thaw("harness"), free_running())[1],
            "harness, bare script": lambda: (thaw("harness"), script_decode(invariants=False, trace=False))[1],
            "harness, default script": lambda: (thaw("harness"), script_decode())[1],
        }
        walls: Dict[str, List[float]] = {name: [] for name in FIGURES}
        for r in range(rounds):
            order = FIGURES[r % len(FIGURES):] + FIGURES[:r % len(FIGURES)]
            for name in order:
                walls[name].append(runs[name]())
            print(f"[bench] {topology}: round {r + 1}/{rounds}: "
                  + ", ".join(f"{name} {walls[name][-1]:.3f}s" for name in FIGURES), file=sys.stderr, flush=True)
        return walls
    finally:
        for pids in frozen.values():
            signal_all(pids, signal.SIGCONT)
        if harness is not None:
            harness.shutdown()
        plain.stop()


def table(topology: str, tokens: int, walls: Dict[str, List[float]]) -> str:
    def spread(values: List[float], fmt: str) -> str:
        return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}..{fmt.format(max(values))})"

    rows = [f"| {topology} | figure | decode wall, {tokens} tokens (s) | tokens/s | / plain (per round) | target |",
            "|---|---|---|---|---|---|"]
    for name in FIGURES:
        ratio = [p / w for p, w in zip(walls["plain"], walls[name])]
        judged = name.endswith("script")
        verdict = ""
        if judged:
            verdict = f">= {TARGET}x: " + ("met" if statistics.median(ratio) >= TARGET else "**NOT met**")
        rows.append(f"| | {name} | {spread(walls[name], '{:.3f}')} | {tokens / statistics.median(walls[name]):.0f} "
                    f"| {'1' if name == 'plain' else spread(ratio, '{:.3f}x')} | {verdict} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topology", default="pp1-overlap")
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    if args.rounds < 1 or args.tokens < 1:
        ap.error("--rounds and --tokens must be at least 1")
    t0 = time.monotonic()
    walls = measure(args.topology, args.tokens, args.rounds)
    import platform

    from hooks import sglang_compat

    print(f"{time.strftime('%Y-%m-%d')}, sglang {sglang_compat.installed_sglang_version()}, "
          f"{os.cpu_count()} cores ({platform.machine()}), {args.rounds} rounds, "
          f"{time.monotonic() - t0:.0f} s in all\n")
    print(table(args.topology, args.tokens, walls))


if __name__ == "__main__":
    main()
