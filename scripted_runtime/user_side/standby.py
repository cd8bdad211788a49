"""A standby server: a second server of the same configuration, started
(and prepared) in a background thread, swapped in when the live one dies so
the next program does not wait for a full start (harness process).

Where a restart's time goes (pp=4 on the 2-core box: bench/README.md,
"Crash recovery"): almost all of it is the four ranks importing SGLang and
torch and building the model, which no harness setting shortens. So the
time is moved, not cut: the standby starts while programs run, and a crash
costs only the swap. Its price is a second server's memory (measured there)
and the CPU its start takes from the programs running beside it.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional


class Standby:
    """One server of ``template``'s configuration, starting in the
    background; ``prepare(server)`` runs on it in the same thread once it is
    ready (the output oracle's references, say)."""

    def __init__(self, template: Any, *, prepare: Callable[[Any], None] = lambda server: None,
                 progress: Callable[[str], None] = lambda line: None) -> None:
        self.server = template.sibling()
        self.error: Optional[BaseException] = None
        self.ready_s: Optional[float] = None  # from start to ready and prepared
        self._prepare = prepare
        self._progress = progress
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._start, name="scripted-runtime-standby", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            self.server.launch()
            self._prepare(self.server)
            self.ready_s = time.monotonic() - self._t0
            self._progress(f"standby server ready in {self.ready_s:.1f}s (swapped in if the live one dies)")
        except BaseException as exc:  # noqa: BLE001 - reported by take()
            self.error = exc

    @property
    def ready(self) -> bool:
        return not self._thread.is_alive() and self.error is None

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the start (and ``prepare``) to end;
        whether it is ready (else still starting, or ``error`` says why not)."""
        self._thread.join(timeout_s)
        return self.ready

    def take(self, timeout_s: float) -> Optional[Any]:
        """The standby server, waiting up to ``timeout_s`` for it to be
        ready; None (and nothing left running) if it failed or is not ready
        in time: the caller then restarts as usual."""
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._progress(f"standby server not ready within {timeout_s:.0f}s; abandoning it")
            self.close()
            return None
        if self.error is not None:
            self._progress(f"standby server failed to start: {str(self.error).splitlines()[0][:200]}")
            self.server.shutdown()
            return None
        return self.server

    def close(self, join_s: float = 30.0) -> None:
        """Stop it, whether starting or ready: nothing is left running."""
        self.server.abandon()
        self._thread.join(join_s)
        self.server.shutdown()
