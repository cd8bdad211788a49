"""One live server per configuration (``ServerConfig.key()``: device,
topology, engine arguments, reverted fixes, patches, extensions), started on
first use and restarted when dead."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Union

from scripted_runtime.user_side.server import ScriptedServer
from scripted_runtime.user_side.server_config import ServerConfig


class ServerPool:
    def __init__(self, *, device: str = "cpu", log_dir: Optional[Path] = None, **engine_overrides: Any) -> None:
        """``device`` and ``engine_overrides``: what ``get(topology)`` builds
        its configurations with (a ``ServerConfig`` passed in is used as is)."""
        self.device = device
        self.log_dir = log_dir
        self.engine_overrides = engine_overrides
        self.servers: Dict[str, ScriptedServer] = {}

    def config(self, topology: str, *, engine_overrides: Optional[Dict[str, Any]] = None,
               revert_fixes: Iterable[str] = (), patches: Iterable[str] = (),
               extensions: Iterable[str] = ()) -> ServerConfig:
        """The configuration ``get(topology, ...)`` means: the pool's device,
        its engine arguments updated with ``engine_overrides``."""
        return ServerConfig(topology=topology, device=self.device,
                            engine_overrides={**self.engine_overrides, **(engine_overrides or {})},
                            revert_fixes=tuple(revert_fixes), patches=tuple(patches), extensions=tuple(extensions))

    def get(self, config: Union[ServerConfig, str], **by_topology: Any) -> ScriptedServer:
        """The live server of ``config`` (a ``ServerConfig``, or a topology
        name with ``config``'s keywords)."""
        if not isinstance(config, ServerConfig):
            config = self.config(config, **by_topology)
        elif by_topology:
            raise TypeError(f"ServerPool.get: a ServerConfig takes no keywords (got {', '.join(sorted(by_topology))})")
        key = config.key()
        server = self.servers.get(key)
        if server is not None and server.alive:
            return server
        t0 = time.monotonic()
        what = config.describe()
        print(f"\n[scripted-runtime] starting {what} server on {config.device}...", file=sys.stderr, flush=True)
        if server is not None:
            server.restart()
        else:
            server = ScriptedServer.start(config, log_dir=self.log_dir)
            self.servers[key] = server
        print(f"[scripted-runtime] {what} ready in {time.monotonic() - t0:.1f}s ({server.origin})", file=sys.stderr,
              flush=True)
        return server

    def shutdown_all(self) -> None:
        for server in self.servers.values():
            server.shutdown()
        self.servers.clear()
