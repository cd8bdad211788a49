"""The trainer rank of ``init_weights_update_group`` /
``update_weights_from_distributed`` (scheduler process, driver rank).

An RL trainer joins the inference engine's weight-update process group as
rank 0 and broadcasts its new weights over it while the scheduler's handler
receives them. The harness runs that rank as a process of its own
(``weight_trainer_main``), started by the first ``ctx`` call that needs it
and kept for the scheduler's life (it imports torch and SGLang once); the
scheduler's death ends it.

The scheduler receives the broadcast inside its handler, which runs when
an iteration ingests the request; a broadcast with no receiver would block
the trainer forever, and a receive with no sender would block the
scheduler. So the trainer is told to broadcast by the driver's dispatcher
(``on_dispatch``), right before SGLang's handler runs, and only when that
handler will receive (``sglang_compat.distributed_update_receives``: a
weight-update session open, the group joined). Every wait here has a
deadline and names what it waited for.
"""
from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

from scripted_runtime.hooks import sglang_compat

START_TIMEOUT_S = 90.0  # the trainer imports torch and SGLang (~5-15 s on 2 cores)
ANSWER_TIMEOUT_S = 60.0  # a join's or a broadcast's answer once the scheduler took its part
INIT_TYPE = "InitWeightsUpdateGroupReqInput"
DESTROY_TYPE = "DestroyWeightsUpdateGroupReqInput"
# the requests whose handling the trainer rank takes part in (the driver's dispatcher hands it these)
TYPES = frozenset({INIT_TYPE, sglang_compat.DISTRIBUTED_UPDATE_TYPE, DESTROY_TYPE})


class TrainerError(RuntimeError):
    """The trainer rank did not answer as it must (the message names what
    was waited for, and the trainer's state and stderr)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class WeightTrainer:
    """The trainer process, and what this rank's groups expect of it."""

    def __init__(self) -> None:
        self._proc: Optional[subprocess.Popen] = None
        self._answers: "queue.Queue[dict]" = queue.Queue()
        self._stderr = None
        self.joining: Dict[str, int] = {}  # group -> port: told to join, the scheduler's join not processed
        self.broadcasts: Dict[str, dict] = {}  # group -> the broadcast the next distributed update receives
        self.error: Optional[str] = None  # what the trainer failed, until the driver reported it

    # --- the process ----------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self.alive else None

    def _start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "SCRIPTED_RUNTIME_HOOKS"}  # no patches in it
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "scripted_runtime.scheduler_side.weight_trainer_main", str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=env)
        self._answers = queue.Queue()
        threading.Thread(target=self._read, args=(self._proc.stdout, self._answers),
                         name="weight-trainer-reader", daemon=True).start()

    @staticmethod
    def _read(stream: Any, answers: "queue.Queue[dict]") -> None:
        for line in stream:
            try:
                answers.put(json.loads(line))
            except ValueError:
                answers.put({"error": f"unreadable answer {line[:200]!r}"})
        answers.put({"exited": True})

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read()[-1500:].strip()

    def _send(self, command: dict) -> None:
        if not self.alive:
            self._start()
        self._proc.stdin.write(json.dumps(command) + "\n")
        self._proc.stdin.flush()

    def _wait(self, key: str, group: str, timeout_s: float, what: str) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            try:
                answer = self._answers.get(timeout=max(0.0, left))
            except queue.Empty:
                raise TrainerError(f"the trainer rank did not answer {what} within {timeout_s:.0f}s (its pid "
                                   f"{self.pid}, alive: {self.alive}; stderr: {self._stderr_tail() or 'empty'})")
            if answer.get(key) == group:
                return answer
            if "error" in answer or "exited" in answer:
                raise TrainerError(f"the trainer rank failed {what}: {answer.get('error') or 'it exited'} "
                                   f"(stderr: {self._stderr_tail() or 'empty'})")

    # --- what ctx asks ---------------------------------------------------------
    def join(self, group: str, backend: str) -> int:
        """Have the trainer open the group's store on a free port and wait
        there for the scheduler (rank 1); returns the port. Answers once
        the trainer is waiting, so the scheduler's join cannot block on a
        trainer that is not coming."""
        port = free_port()
        self._send({"op": "join", "group": group, "port": port, "world_size": 2, "backend": backend})
        self._wait("joining", group, START_TIMEOUT_S, f"that it waits for the scheduler in group {group!r}")
        self.joining[group] = port
        return port

    def expect_broadcast(self, group: str, path: str, names: List[str]) -> None:
        """The next distributed update of ``group`` the scheduler receives
        is broadcast from ``path``'s tensors ``names``, in that order."""
        self.broadcasts[group] = {"op": "broadcast", "group": group, "path": path, "names": list(names)}

    # --- what the driver's dispatcher tells it ----------------------------------
    def before_dispatch(self, scheduler: Any, recv_req: Any) -> None:
        """Right before SGLang handles ``recv_req``: a distributed update
        whose handler will receive gets its broadcast started."""
        if type(recv_req).__name__ != sglang_compat.DISTRIBUTED_UPDATE_TYPE:
            return
        group = getattr(recv_req, "group_name", None)
        command = self.broadcasts.pop(group, None)
        if command is not None and self.alive and sglang_compat.distributed_update_receives(scheduler, recv_req):
            self._send(command)
            self.broadcasts[group] = dict(command, started=True)

    def after_dispatch(self, scheduler: Any, recv_req: Any, output: Any) -> None:
        """Right after SGLang handled ``recv_req``: collect the trainer's
        side of a join or a broadcast (both ended when the scheduler's did),
        and have it leave a group the scheduler destroyed. Never raises into
        SGLang's loop: a trainer that does not answer is ended and its error
        kept in ``error`` (the driver fails the script with it)."""
        kind = type(recv_req).__name__
        group = getattr(recv_req, "group_name", None)
        try:
            if kind == INIT_TYPE and group in self.joining:
                del self.joining[group]
                if getattr(output, "success", False):
                    self._wait("joined", group, ANSWER_TIMEOUT_S, f"that group {group!r} formed")
                else:  # the scheduler did not come: the trainer would wait in the store for 30 minutes
                    self.close()
            elif kind == sglang_compat.DISTRIBUTED_UPDATE_TYPE and self.broadcasts.get(group, {}).get("started"):
                del self.broadcasts[group]
                self._wait("broadcast", group, ANSWER_TIMEOUT_S, f"the end of its broadcast over group {group!r}")
            elif kind == DESTROY_TYPE and getattr(output, "success", False) and self.alive:
                self._send({"op": "leave", "group": group})
                self._wait("left", group, ANSWER_TIMEOUT_S, f"that it left group {group!r}")
        except TrainerError as e:
            self.error = str(e)
            self.close()

    def forget_error(self) -> None:
        """The reset: the previous script's trainer error was reported. A
        broadcast it announced is kept: its update may still be processed in
        the reset (an operation posted and not waited for lands there), and
        a receive with no sender would block the scheduler."""
        self.error = None

    def close(self) -> None:
        """End the trainer process (bounded)."""
        proc, self._proc = self._proc, None
        self.joining.clear()
        if proc is None:
            return
        try:
            proc.stdin.close()
            proc.wait(timeout=5)
        except Exception:  # noqa: BLE001 - ended below
            proc.kill()
            proc.wait(timeout=5)
