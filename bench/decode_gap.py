"""Where does the harness's pp=1 decode time go, against a plain launch_server?

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
issue 6 (>= 0.95x plain). The plain server is started as bench/compare.py's
``server`` system (``compare_child.PlainServer``).
"""
from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import compare_scripts  # noqa: E402
import probe_scripts  # noqa: E402
import requests  # noqa: E402
from compare_child import START_TIMEOUT_S, PlainServer  # noqa: E402
from proctree import signal_all  # noqa: E402
from stats import machine_line, md_table, meets, ratios, rotated, spread  # noqa: E402

from scripted_runtime import ScriptedServer  # noqa: E402

SETTLE_S = 1.0
POST_TIMEOUT_S = 120.0
FIGURES = ("plain", "harness, free-running", "harness, bare script", "harness, default script")
TARGET = 0.95


def generate(url: str, tokens: int, api_key: str = "") -> float:
    """One non-streamed /generate of ``tokens`` tokens; its wall time. ``api_key``:
    the harness's server's key (``ScriptedServer.api_key``), none for the plain server."""
    t = time.monotonic()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    resp = requests.post(url + "/generate", json={
        "input_ids": [1] * compare_scripts.DECODE_PROMPT_LEN,
        "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}, headers=headers,
        timeout=POST_TIMEOUT_S)
    resp.raise_for_status()
    got = len(resp.json()["output_ids"])
    if got != tokens:
        raise RuntimeError(f"/generate at {url} returned {got} tokens, asked for {tokens}")
    return time.monotonic() - t


def measure(topology: str, tokens: int, rounds: int) -> Dict[str, List[float]]:
    print(f"[bench] {topology}: starting the plain launch_server...", file=sys.stderr, flush=True)
    plain = PlainServer(topology, log_prefix="decode-gap-plain-")
    try:
        plain.wait_healthy(time.monotonic() + START_TIMEOUT_S)
    except BaseException:
        plain.stop()
        raise
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
                    took["wall_s"] = generate(harness_url, tokens, harness.api_key)
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
            for name in rotated(FIGURES, r):
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
    rows = []
    for name in FIGURES:
        ratio = ratios(walls["plain"], walls[name])  # a rate's ratio: plain's wall over this one's
        verdict = ""
        if name.endswith("script"):
            verdict = f">= {TARGET}x: " + ("met" if meets(ratio, ">=", TARGET) else "**NOT met**")
        rows.append(["", name, spread(walls[name], "{:.3f}"), f"{tokens / statistics.median(walls[name]):.0f}",
                     "1" if name == "plain" else spread(ratio, "{:.3f}x"), verdict])
    return md_table([topology, "figure", f"decode wall, {tokens} tokens (s)", "tokens/s", "/ plain (per round)",
                     "target"], rows)


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
    print(f"{machine_line()}, {args.rounds} rounds, {time.monotonic() - t0:.0f} s in all\n")
    print(table(args.topology, args.tokens, walls))


if __name__ == "__main__":
    main()
