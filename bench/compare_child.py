"""One system of bench/compare.py, in a fresh process:

    python bench/compare_child.py SYSTEM TOPOLOGY DECODE_TOKENS SHORT_RUNS DECODE_RUNS [--paired]

SYSTEM is ``harness`` (ours), ``upstream`` (SGLang's built-in
``sglang.test.scripted_runtime``), ``engine`` (plain ``sglang.Engine``) or
``server`` (plain ``launch_server``, no hook). Every system gets the same
engine arguments and the same CPU enablement (``hooks/``); only ours has the
scheduler hook. The child reports on stdout as ``@@ {json}`` lines:

* ``started``  - seconds from the start call to "a script (or request) can go";
* ``paired``   - (with ``--paired``) the work above is done; the child now
  takes ``decode`` lines on stdin, answering each with a ``decoded`` event
  (one decode; ours runs one per configuration, under ``configs``), until
  ``end``; the parent freezes it in between;
* ``quiet``    - all timed work is done and the server is still up; the child
  waits for a line on stdin while the parent reads the tree's PSS (reading
  ``smaps_rollup`` takes each process's mmap lock, so it is never done while
  something is being timed);
* ``shutdown`` - seconds the shutdown took; the child then waits for a line on
  stdin so the parent can look for processes left behind before it exits;
* ``result``   - ``DECODE_RUNS`` decode wall times per configuration (ours
  interleaves its configurations run by run), per-script overhead samples.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import List

# Every system's start clock starts here, before it imports anything of
# SGLang: a user's process pays those imports before its first script too.
T0 = time.monotonic()
ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

import compare_scripts  # noqa: E402
from stats import rotated, wall_times  # noqa: E402

from scripted_runtime.hooks import sglang_compat  # noqa: E402
from scripted_runtime import protocol  # noqa: E402
from scripted_runtime.user_side import processes, upstream_run  # noqa: E402

HOST = "127.0.0.1"
START_TIMEOUT_S = 600.0
RUN_TIMEOUT_S = 300.0
PARENT_ACK_TIMEOUT_S = 30.0
# Between paired decodes the parent keeps the child frozen while other
# systems start (pp4: minutes); stdin EOF (the parent died) ends it at once.
PAIRED_COMMAND_TIMEOUT_S = 1800.0
PAIRED = "--paired" in sys.argv


def emit(event: str, **fields) -> None:
    print("@@ " + json.dumps({"event": event, **fields}), flush=True)


def await_parent() -> None:
    """Wait (bounded) for the parent's go-ahead after a ``quiet`` or
    ``shutdown`` report."""
    ready, _, _ = select.select([sys.stdin], [], [], PARENT_ACK_TIMEOUT_S)
    if ready:
        sys.stdin.readline()


def paired_decodes(decode_once) -> None:
    """Answer the parent's ``decode`` commands until ``end`` (or EOF, or no
    command within PAIRED_COMMAND_TIMEOUT_S)."""
    if not PAIRED:
        return
    emit("paired")
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], PAIRED_COMMAND_TIMEOUT_S)
        line = sys.stdin.readline().strip() if ready else ""
        if line != "decode":
            return
        emit("decoded", **decode_once())


def checkpoint() -> None:
    """Timed work done, server still up: let the parent take its readings."""
    emit("quiet")
    await_parent()


def engine_kwargs(topology: str) -> dict:
    return upstream_run.cpu_engine_kwargs(topology)


def sglang_env(kwargs: dict, *, upstream: bool = False) -> dict:
    """The environment of an SGLang server without our scheduler hook
    (``upstream_run.server_env``), with bench/ importable for the scripts."""
    return upstream_run.server_env(kwargs, upstream=upstream, paths=[str(BENCH)])


def read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


# --- our harness ----------------------------------------------------------------
def run_harness(t0: float, topology: str, decode_tokens: int, short_runs: int, decode_runs: int) -> dict:
    from scripted_runtime import ScriptedServer

    server = ScriptedServer.start(topology=topology)
    emit("started", start_s=time.monotonic() - t0)
    out = tempfile.mktemp(suffix=".json")

    names = list(compare_scripts.HARNESS_CONFIGS)
    turns = [0]

    def decode_once() -> dict:
        """One decode per configuration, back to back, in an order rotated
        at every call: in a paired turn the first decode follows the thaw,
        and no configuration should always be the one that does."""
        configs = {}
        for name in rotated(names, turns[0]):
            server.run(compare_scripts.decode, decode_tokens, out, timeout=RUN_TIMEOUT_S,
                       **compare_scripts.HARNESS_CONFIGS[name]).raise_if_failed()
            configs[name] = read_json(out)
        turns[0] += 1
        return {"configs": configs}

    decode = {name: [] for name in compare_scripts.HARNESS_CONFIGS}
    try:
        server.run(compare_scripts.short).raise_if_failed()  # first script: warm paths
        for _ in range(decode_runs):  # interleaved, so drift hits every configuration alike
            for name, result in decode_once()["configs"].items():
                decode[name].append(result)
        short = {name: wall_times(lambda: server.run(compare_scripts.short, **compare_scripts.HARNESS_CONFIGS[name])
                                  .raise_if_failed(), short_runs)
                 for name in ("bare", "default")}
        paired_decodes(decode_once)
        checkpoint()
    finally:
        shutdown_s = server.shutdown()
    emit("shutdown", shutdown_s=shutdown_s)
    await_parent()
    return {"decode": decode, "short": short}


# --- SGLang's built-in harness ----------------------------------------------------
def run_upstream(t0: float, topology: str, decode_tokens: int, short_runs: int, decode_runs: int) -> dict:
    kwargs = engine_kwargs(topology)
    os.environ.update(sglang_env(kwargs, upstream=True))
    from scripted_runtime import hooks

    hooks.activate()  # CPU enablement and the upstream switch in this process too
    from sglang.srt.server_args import ServerArgs
    from sglang.test.scripted_runtime.http_server import ScriptedHttpServer

    kwargs.update(sglang_compat.cpu_server_args(ServerArgs, kwargs))
    kwargs.update(sglang_compat.UPSTREAM_HARNESS_CPU_ARGS)
    server = ScriptedHttpServer.start(**kwargs)
    emit("started", start_s=time.monotonic() - t0)
    out = tempfile.mktemp(suffix=".json")

    def decode_once() -> dict:
        server.execute_script(compare_scripts.decode, args=(decode_tokens, out), timeout_s=RUN_TIMEOUT_S)
        return read_json(out)

    try:
        server.execute_script(compare_scripts.short)  # first script: warm paths
        decode = {"default": [decode_once() for _ in range(decode_runs)]}
        samples = wall_times(lambda: server.execute_script(compare_scripts.short), short_runs)
        paired_decodes(decode_once)
        checkpoint()
    finally:
        t = time.monotonic()
        server.shutdown()
        shutdown_s = time.monotonic() - t
    emit("shutdown", shutdown_s=shutdown_s)
    await_parent()
    return {"decode": decode, "short": {"default": samples}}


# --- plain Engine -----------------------------------------------------------------
def run_engine(t0: float, topology: str, decode_tokens: int, short_runs: int, decode_runs: int) -> dict:
    kwargs = engine_kwargs(topology)
    os.environ.update(sglang_env(kwargs))
    from scripted_runtime import hooks

    hooks.activate()
    import sglang

    engine = sglang.Engine(**kwargs)
    emit("started", start_s=time.monotonic() - t0)

    def generate(prompt_len: int, new_tokens: int) -> dict:
        return engine.generate(input_ids=[1] * prompt_len,
                               sampling_params={"max_new_tokens": new_tokens, "ignore_eos": True})

    try:
        work = plain_work(generate, decode_tokens, short_runs, decode_runs)
    finally:
        t = time.monotonic()
        engine.shutdown()
        shutdown_s = time.monotonic() - t
    emit("shutdown", shutdown_s=shutdown_s)
    await_parent()
    return work


def plain_work(generate, decode_tokens: int, short_runs: int, decode_runs: int) -> dict:
    """What a plain system does between start and shutdown: the short
    request, the decodes alone, the paired decodes, the quiet checkpoint."""
    short = plain_runs(generate, short_runs)
    decode = {"plain": [plain_decode(generate, decode_tokens) for _ in range(decode_runs)]}
    paired_decodes(lambda: plain_decode(generate, decode_tokens))
    checkpoint()
    return {"decode": decode, "short": short}


def plain_runs(generate, short_runs: int) -> dict:
    """The short script's request sent ``short_runs`` times (after one to warm
    up): what a script costs with no harness at all."""
    generate(compare_scripts.SHORT_PROMPT_LEN, compare_scripts.SHORT_NEW_TOKENS)
    return {"plain": wall_times(lambda: generate(compare_scripts.SHORT_PROMPT_LEN, compare_scripts.SHORT_NEW_TOKENS),
                                short_runs)}


def plain_decode(generate, decode_tokens: int) -> dict:
    """The decode script's request alone, once."""
    t = time.monotonic()
    out = generate(compare_scripts.DECODE_PROMPT_LEN, decode_tokens)
    return {"wall_s": time.monotonic() - t, "tokens": len(out["output_ids"])}


# --- plain launch_server ------------------------------------------------------------
class PlainServer:
    """``launch_server`` without our scheduler hook, in a session of its own:
    the ``server`` system here and the plain side of bench/decode_gap.py. It
    is healthy once ``/health`` answers 200, which it does from the server
    status alone (no probe generation) after launch_server's own warmup
    request was served."""

    def __init__(self, topology: str, log_prefix: str = "bench-server-") -> None:
        from scripted_runtime.user_side.server import free_port

        kwargs = engine_kwargs(topology)
        port = free_port()
        kwargs.update(host=HOST, port=port)
        self.url = f"http://{HOST}:{port}"
        self.server_id = uuid.uuid4().hex
        env = sglang_env(kwargs)
        env["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] = "0"
        env[protocol.ENV_SERVER_ID] = self.server_id
        env[protocol.ENV_HARNESS_PID] = str(os.getpid())
        self.log = tempfile.NamedTemporaryFile(prefix=log_prefix, suffix=".log", delete=False)
        self.proc = subprocess.Popen([sys.executable, "-m", "scripted_runtime.user_side.launch", json.dumps(kwargs)],
                                     env=env, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, cwd=str(ROOT))
        self.start = processes.start_time(self.proc.pid)

    def wait_healthy(self, deadline: float) -> None:
        """Until ``/health`` says 200; raises when the launcher exits or at
        ``deadline`` (``time.monotonic()``)."""
        import requests

        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"launch_server exited with {self.proc.returncode}; log {self.log.name}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"launch_server not healthy within {START_TIMEOUT_S:.0f}s; log {self.log.name}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)

    def pids(self) -> List[int]:
        return processes.pids_of_server(self.server_id, self.proc.pid, self.start)

    def shutdown(self) -> List[int]:
        """What an operator does: SIGTERM the server's group, wait until every
        process of it is gone (SIGKILL after a grace period). Returns the
        processes that survived even SIGKILL."""
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 30.0
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.02)
        left = processes.kill_server(self.server_id, self.proc.pid, term_grace_s=0.0, pgid_start=self.start)
        self.proc.wait(timeout=5)
        return left

    def stop(self) -> None:
        """Kill it (untimed, short grace); raises if a process survives."""
        left = processes.kill_server(self.server_id, self.proc.pid, pgid_start=self.start)
        self.proc.wait(timeout=10)
        if left:
            raise RuntimeError(f"plain launch_server processes survived SIGKILL: {left}")


def run_server(t0: float, topology: str, decode_tokens: int, short_runs: int, decode_runs: int) -> dict:
    import requests

    server = PlainServer(topology)
    try:
        server.wait_healthy(t0 + START_TIMEOUT_S)
        emit("started", start_s=time.monotonic() - t0)

        def generate(prompt_len: int, new_tokens: int) -> dict:
            resp = requests.post(server.url + "/generate", json={
                "input_ids": [1] * prompt_len,
                "sampling_params": {"max_new_tokens": new_tokens, "ignore_eos": True}}, timeout=RUN_TIMEOUT_S)
            resp.raise_for_status()
            return resp.json()

        work = plain_work(generate, decode_tokens, short_runs, decode_runs)
    finally:
        t = time.monotonic()
        left = server.shutdown()
        shutdown_s = time.monotonic() - t
    emit("shutdown", shutdown_s=shutdown_s, survived_sigkill=left)
    await_parent()
    return work


SYSTEMS = {"harness": run_harness, "upstream": run_upstream, "engine": run_engine, "server": run_server}


def main() -> None:
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        return
    argv = [a for a in sys.argv[1:] if a != "--paired"]
    if len(argv) != 5 or argv[0] not in SYSTEMS:
        sys.exit(f"usage: compare_child.py {{{','.join(SYSTEMS)}}} TOPOLOGY DECODE_TOKENS SHORT_RUNS DECODE_RUNS "
                 f"[--paired] (got {sys.argv[1:]})")
    system, topology = argv[0], argv[1]
    decode_tokens, short_runs, decode_runs = (int(a) for a in argv[2:5])
    emit("result", **SYSTEMS[system](T0, topology, decode_tokens, short_runs, decode_runs))


if __name__ == "__main__":
    main()
