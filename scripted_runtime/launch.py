"""Entry point of a launched server process: ``python -m scripted_runtime.launch ARGS_JSON``.

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

from scripted_runtime.protocol import ENV_HARNESS_PID

EXIT_BAD_ENGINE_ARGS = 3
BAD_ARGS_MARKER = "SCRIPTED_RUNTIME_BAD_ENGINE_ARGS:"


def _watch_harness(harness_pid: int) -> None:
    while True:
        time.sleep(1.0)
        try:
            os.kill(harness_pid, 0)
        except ProcessLookupError:
            os.killpg(0, signal.SIGKILL)


def main() -> None:
    kwargs = json.loads(sys.argv[1])
    harness_pid = int(os.environ.get(ENV_HARNESS_PID, "0"))
    if harness_pid:
        threading.Thread(target=_watch_harness, args=(harness_pid,), daemon=True).start()

    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.server_args import ServerArgs

    if kwargs.get("device") == "cpu":
        from hooks import sglang_compat

        kwargs.update(sglang_compat.cpu_server_args(ServerArgs, kwargs))
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
