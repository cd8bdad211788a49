"""One live server per configuration (topology, engine arguments, reverted
fixes, patches), started on first use and restarted when dead."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Tuple

from scripted_runtime.user_side.server import ScriptedServer


def config_key(topology: str, engine_overrides: Optional[Dict[str, Any]] = None, revert_fixes: Iterable[str] = (),
               patches: Iterable[str] = (), extensions: Iterable[str] = ()) -> Tuple:
    return (topology, json.dumps(engine_overrides or {}, sort_keys=True, default=str), tuple(revert_fixes),
            tuple(patches), tuple(extensions))


class ServerPool:
    def __init__(self, *, device: str = "cpu", log_dir: Optional[Path] = None, **engine_overrides: Any) -> None:
        self.device = device
        self.log_dir = log_dir
        self.engine_overrides = engine_overrides
        self.servers: Dict[Tuple, ScriptedServer] = {}

    def get(self, topology: str, *, engine_overrides: Optional[Dict[str, Any]] = None,
            revert_fixes: Iterable[str] = (), patches: Iterable[str] = (),
            extensions: Iterable[str] = ()) -> ScriptedServer:
        """The live server of this configuration (the pool's engine
        arguments updated with ``engine_overrides``)."""
        overrides = {**self.engine_overrides, **(engine_overrides or {})}
        revert_fixes, patches, extensions = list(revert_fixes), list(patches), list(extensions)
        key = config_key(topology, overrides, revert_fixes, patches, extensions)
        server = self.servers.get(key)
        if server is not None and server.alive:
            return server
        t0 = time.monotonic()
        what = topology + "".join(f" --revert-fix {f}" for f in revert_fixes) + "".join(
            f" --patch {p}" for p in patches) + "".join(f" --extension {e}" for e in extensions) + "".join(
            f" {k}={v}" for k, v in (engine_overrides or {}).items())
        print(f"\n[scripted-runtime] starting {what} server on {self.device}...", file=sys.stderr, flush=True)
        if server is not None:
            server.restart()
        else:
            server = ScriptedServer.start(device=self.device, topology=topology, log_dir=self.log_dir,
                                          revert_fixes=revert_fixes, patches=patches, extensions=extensions,
                                          **overrides)
            self.servers[key] = server
        print(f"[scripted-runtime] {what} ready in {time.monotonic() - t0:.1f}s", file=sys.stderr, flush=True)
        return server

    def shutdown_all(self) -> None:
        for server in self.servers.values():
            server.shutdown()
        self.servers.clear()
