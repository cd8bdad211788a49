"""One live server per topology, started on first use and restarted when dead."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional

from scripted_runtime.user_side.server import ScriptedServer


class ServerPool:
    def __init__(self, *, device: str = "cpu", log_dir: Optional[Path] = None, **engine_overrides: Any) -> None:
        self.device = device
        self.log_dir = log_dir
        self.engine_overrides = engine_overrides
        self.servers: Dict[str, ScriptedServer] = {}

    def get(self, topology: str) -> ScriptedServer:
        server = self.servers.get(topology)
        if server is not None and server.alive:
            return server
        t0 = time.monotonic()
        print(f"\n[scripted-runtime] starting {topology} server on {self.device}...", file=sys.stderr, flush=True)
        if server is not None:
            server.restart()
        else:
            server = ScriptedServer.start(device=self.device, topology=topology,
                                          log_dir=self.log_dir, **self.engine_overrides)
            self.servers[topology] = server
        print(f"[scripted-runtime] {topology} ready in {time.monotonic() - t0:.1f}s", file=sys.stderr, flush=True)
        return server

    def shutdown_all(self) -> None:
        for server in self.servers.values():
            server.shutdown()
        self.servers.clear()
