"""The failure database: failing programs kept across runs and runners, and
replayed first by the next exploration (harness process).

Storage is Hypothesis's own example databases (``hypothesis.database``):
a local ``DirectoryBasedExampleDatabase`` by default, a shared
``RedisExampleDatabase`` for ``redis://HOST:PORT[/DB]``, either made
read-only with ``ReadOnlyDatabase`` (the pull-request recipe in
docs/exploring.md). What is stored is the failing *program* (its actions as
JSON), not Hypothesis's choice sequence: the ``ci`` profile is
derandomized, and Hypothesis ignores a database for a derandomized test
(``derandomize=True implies database=None``), so its own ``reuse`` phase
would never run there; a stored program is replayed first as an explicit
example (Hypothesis's ``explicit`` phase) on every profile, and stays
readable. Keys keep apart what must not mix: the SGLang build (version and
the patches and reverted fixes applied), the topology, and the program
grammar's version (``actions.GRAMMAR_VERSION``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import typing
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from scripted_runtime.user_side.explore import actions as A
from scripted_runtime.user_side.server_config import ServerConfig

DEFAULT_DIR = "failure-db"  # under the exploration's --out: a command writes only there
NONE = "none"
_TYPES = {cls.__name__: cls for cls in typing.get_args(A.Action)}  # every action the grammar has


class DatabaseError(ValueError):
    """A ``--database`` value that cannot be used (one line, names what to pass)."""


def encode_action(action: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = {"type": type(action).__name__}
    for f in dataclasses.fields(action):
        value = getattr(action, f.name)
        out[f.name] = encode_action(value) if dataclasses.is_dataclass(value) else value
    return out


def decode_action(data: Dict[str, Any]) -> Any:
    data = dict(data)
    cls = _TYPES[data.pop("type")]
    return cls(**{k: decode_action(v) if isinstance(v, dict) else v for k, v in data.items()})


def encode(program: Sequence[Any]) -> bytes:
    return json.dumps([encode_action(a) for a in program], sort_keys=True).encode()


def decode(blob: bytes) -> Optional[List[Any]]:
    """The program, or None for a blob this grammar cannot read (skipped)."""
    try:
        return [decode_action(a) for a in json.loads(blob)]
    except (ValueError, KeyError, TypeError):
        return None


def key(config: ServerConfig, sglang_version: str) -> bytes:
    """The database key of one configuration: build (SGLang version, the
    patches and reverted fixes applied, the engine overrides), topology,
    grammar. The device, the extensions and the checks are not in it (they
    never were: a key written by an earlier release still matches), nor the
    workarounds of registered bugs an exploration adds (``hooks/workarounds.py``:
    the same build's failures, found with or without them, are one set)."""
    from scripted_runtime.hooks import workarounds

    patches = sorted(workarounds.without_workarounds(config.patches))
    build = json.dumps({"sglang": sglang_version, "patches": patches,
                        "reverted": sorted(config.revert_fixes),
                        "engine": {k: str(v) for k, v in sorted(config.engine_overrides)}},
                       sort_keys=True)
    digest = hashlib.sha256(build.encode()).hexdigest()[:16]
    return f"scripted-runtime:g{A.GRAMMAR_VERSION}:{config.topology}:{digest}".encode()


def open_database(spec: Optional[str], *, read_only: bool = False, out_dir: Optional[Path] = None) -> Any:
    """``spec``: None (the local default: ``$SCRIPTED_RUNTIME_DATABASE``,
    else ``DEFAULT_DIR`` under ``out_dir``, else under the current directory), a directory,
    ``redis://[[USER]:PASSWORD@]HOST:PORT[/DB]`` (the password is never
    printed: ``redacted``), or ``none``. Returns a Hypothesis
    ``ExampleDatabase`` or None. A Redis server that does not answer is a
    ``DatabaseError`` naming it."""
    from hypothesis.database import DirectoryBasedExampleDatabase, ReadOnlyDatabase

    if spec is None:
        spec = os.environ.get("SCRIPTED_RUNTIME_DATABASE") or str(Path(out_dir or ".") / DEFAULT_DIR)
    if spec == NONE:
        return None
    if spec.startswith("redis://"):
        db = _redis(spec)
    elif "://" in spec:
        raise DatabaseError(f"--database {redacted(spec)!r}: expected a directory, redis://HOST:PORT[/DB] "
                            "or 'none'")
    else:
        db = DirectoryBasedExampleDatabase(str(Path(spec).expanduser()))
    return ReadOnlyDatabase(db) if read_only else db


def redacted(url: str) -> str:
    """``url`` with the password of its user part (``redis://:PASSWORD@HOST``,
    ``redis://USER:PASSWORD@HOST``) replaced by ``***``: what messages print."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    user, at, host = rest.rpartition("@")
    if ":" in user:
        user = user.split(":", 1)[0] + ":***"
    else:
        user = "***"
    return f"{scheme}://{user}{at}{host}"


def _redis(url: str) -> Any:
    shown = redacted(url)
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError as exc:  # the install step installs it
        raise DatabaseError(f"--database {shown}: the redis client is not installed ({exc}); "
                            "run bash ci/install.sh") from exc
    client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10)
    try:
        client.ping()
    except redis.exceptions.RedisError as exc:
        raise DatabaseError(f"--database {shown}: no Redis server answers there "
                            f"({str(exc).replace(url, shown)})") from exc
    return RedisExampleDatabase(client, key_prefix=b"scripted-runtime:")


class FailureStore:
    """The programs stored under one configuration's key."""

    def __init__(self, db: Any, db_key: bytes) -> None:
        self.db, self.key = db, db_key

    def programs(self) -> List[List[Any]]:
        """The stored programs this grammar can read, in a stable order."""
        if self.db is None:
            return []
        blobs = sorted(self.db.fetch(self.key))
        return [p for p in (decode(b) for b in blobs) if p is not None]

    def save(self, program: Sequence[Any]) -> None:
        if self.db is not None:
            self.db.save(self.key, encode(program))

    def delete(self, program: Sequence[Any]) -> None:
        if self.db is not None:
            self.db.delete(self.key, encode(program))
