"""Entry point of a launched server process: ``python -m scripted_runtime.user_side.launch ARGS_JSON``,
or ``main(ARGS_JSON)`` in a process forked from a template
(``template_process.py``).

Runs SGLang's real ``launch_server`` (real HTTP, tokenizer manager, ZMQ, and
scheduler ranks) with the hooks active (sitecustomize, via PYTHONPATH). A
watchdog thread kills the whole process group if the harness that started it
disappears, so a killed test run leaves no server behind.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Optional

from scripted_runtime.user_side import processes
from scripted_runtime.protocol import ENV_API_KEY, ENV_HARNESS_PID

EXIT_BAD_ENGINE_ARGS = 3
BAD_ARGS_MARKER = "SCRIPTED_RUNTIME_BAD_ENGINE_ARGS:"
WATCH_INTERVAL_S = 1.0


def _harness_gone(pid: int, started: Optional[int]) -> bool:
    if started is None:  # no /proc to tell processes apart: the pid alone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    return not processes.same_process_running(pid, started)


def _watch_harness(harness_pid: int) -> None:
    """Kill this process group once the harness has exited: also when it
    is a zombie its parent has not reaped, or its pid went to another
    process (what ``kill(pid, 0)`` alone takes for alive)."""
    started = processes.start_time(harness_pid)
    while True:
        if _harness_gone(harness_pid, started):
            os.killpg(0, signal.SIGKILL)
        time.sleep(WATCH_INTERVAL_S)


def main(args_json: Optional[str] = None) -> None:
    kwargs = json.loads(sys.argv[1] if args_json is None else args_json)
    harness_pid = int(os.environ.get(ENV_HARNESS_PID, "0"))
    if harness_pid:
        threading.Thread(target=_watch_harness, args=(harness_pid,), daemon=True).start()

    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.server_args import ServerArgs

    if kwargs.get("device") == "cpu":
        from scripted_runtime.hooks import sglang_compat

        kwargs.update(sglang_compat.cpu_server_args(ServerArgs, kwargs))
    key = os.environ.get(ENV_API_KEY)
    if key:  # from the environment, never the command line (which every local user can read)
        from scripted_runtime.hooks import sglang_compat

        kwargs.update(sglang_compat.api_key_args(ServerArgs, key))
    try:
        server_args = ServerArgs(**kwargs)
    except TypeError as exc:  # unknown keyword
        print(f"{BAD_ARGS_MARKER} {exc}", file=sys.stderr, flush=True)
        sys.exit(EXIT_BAD_ENGINE_ARGS)
    except (ValueError, AssertionError) as exc:  # ServerArgs' own validation
        print(f"{BAD_ARGS_MARKER} {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.exit(EXIT_BAD_ENGINE_ARGS)
    launch_server(server_args)


if __name__ == "__main__":
    main()
