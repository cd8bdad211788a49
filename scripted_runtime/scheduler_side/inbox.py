"""Stands in for the scheduler's tokenizer socket on the driver rank.

A script that sends a request over HTTP must know that the request has reached
the scheduler's socket before it yields, so that the very next iteration
ingests it. The inbox drains the real socket into a buffer, lets the driver
wait (bounded) for a frame matching a predicate, and hands frames to the
scheduler unchanged through the socket API it already uses.
"""
from __future__ import annotations

import pickle
import time
from collections import deque
from typing import Any, Callable, Deque, List, Optional, Tuple

import zmq

from scripted_runtime.hooks import sglang_compat


# After the HTTP answer of an op that the tokenizer may drop (abort of a
# request it no longer tracks), wait this long for a frame before concluding
# that none was sent.
NO_FRAME_GRACE_S = 0.1

class ArrivalTimeout(TimeoutError):
    pass


_NOTHING_BUFFERED = zmq.Again("scripted-runtime inbox: no frame buffered")


class TokenizerInbox:
    def __init__(self, socket: zmq.Socket) -> None:
        self._socket = socket
        # (raw frame, decoded object for inspection)
        self._buffer: Deque[Tuple[bytes, Any]] = deque()
        self.work_reqs_seen = 0
        self.arrival_listeners: List[Callable[[Any], None]] = []
        self._work_types = sglang_compat.work_request_type_names()

    # --- the socket API the scheduler uses -------------------------------
    # The scheduler reads until zmq.Again on every iteration, so the empty
    # case is the hot one: one EVENTS read and a pre-built exception.
    def recv(self, flags: int = 0, copy: bool = True, track: bool = False) -> bytes:
        self._drain()
        if self._buffer:
            return self._buffer.popleft()[0]
        raise _NOTHING_BUFFERED.with_traceback(None)

    def recv_pyobj(self, flags: int = 0) -> Any:
        self._drain()
        if self._buffer:
            return pickle.loads(self._buffer.popleft()[0])
        raise _NOTHING_BUFFERED.with_traceback(None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._socket, name)

    # --- for the driver ----------------------------------------------------
    def pending(self) -> List[Any]:
        self._drain()
        return [obj for _, obj in self._buffer]

    def inject(self, raw: bytes, obj: Any) -> None:
        """Queue a frame the harness made itself, behind everything that has
        arrived: the scheduler ingests it at its next read. Arrival listeners
        are not told (nothing was posted)."""
        self._drain()
        self._buffer.append((raw, obj))

    def wait_for(
        self,
        predicate: Optional[Callable[[Any], bool]],
        *,
        timeout_s: float,
        what: str,
        already_arrived: Optional[Callable[[], bool]] = None,
    ) -> None:
        """Block until a buffered frame satisfies ``predicate`` (or
        ``already_arrived()`` says it came earlier; with no predicate, only
        ``already_arrived()`` counts)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._drain()
            if predicate is not None and any(predicate(obj) for _, obj in self._buffer):
                return
            if already_arrived is not None and already_arrived():
                return
            if time.monotonic() >= deadline:
                seen = [type(obj).__name__ for _, obj in self._buffer]
                raise ArrivalTimeout(
                    f"{what} did not reach the scheduler within {timeout_s:.0f}s "
                    f"(frames buffered: {seen or 'none'}). The HTTP post may have "
                    "failed or the tokenizer manager may be blocked (e.g. an "
                    "update_weights holding its writer lock)."
                )
            self._socket.poll(2)  # wakes as soon as a frame arrives; 2 ms to re-check already_arrived

    def _drain(self) -> None:
        socket = self._socket
        while socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:  # cheaper than a recv that raises
            try:
                raw = socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            obj = sglang_compat.decode_ipc_frame(raw)
            if type(obj).__name__ in self._work_types:
                self.work_reqs_seen += 1
            for listener in self.arrival_listeners:
                listener(obj)
            self._buffer.append((raw, obj))
