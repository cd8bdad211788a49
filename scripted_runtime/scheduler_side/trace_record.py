"""Builds one step-trace record per iteration and appends it to a JSONL file
(scheduler process). One record describes iteration N: the forwards it
launched and the control answers it produced, the state it left behind,
the windows open and the invariant verdict at the start of iteration N+1,
and the operations the script injected right after (processed in N+1).

Every line goes to the file in its own unbuffered write, so a scheduler
crash leaves the trace up to the step before it.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

from scripted_runtime.hooks import sglang_compat
from scripted_runtime.scheduler_side import state
from scripted_runtime.scheduler_side.context import radix

FORMAT_VERSION = 1

try:  # a dependency of SGLang itself (its HTTP server answers with it): ~14x faster than json
    import orjson

    def encode_line(obj: Dict[str, Any]) -> bytes:
        return orjson.dumps(obj, default=str, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS)
except ImportError:  # pragma: no cover - every SGLang release the harness supports has it
    _ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)  # built once, not per call

    def encode_line(obj: Dict[str, Any]) -> bytes:
        return (_ENCODER.encode(obj) + "\n").encode()


def snapshot(s: Any, view: Any) -> Dict[str, Any]:
    """The state part of a record, from an invariants ``StateView`` (one scan)."""
    done = view.done
    batches: Dict[str, Dict[str, Any]] = {}
    waiting: List[str] = []
    for holder in view.holders:
        if not holder.reqs:
            continue
        rids = [r.rid + "*" if done[id(r)] else r.rid for r in holder.reqs]
        if holder.label == "waiting_queue":
            waiting = rids
        elif holder.batch is not None:
            mode = getattr(getattr(holder.batch, "forward_mode", None), "name", None)
            batches[holder.label] = {"mode": mode.lower() if mode else None, "rids": rids}
    rows: Dict[str, int] = {}
    for r in view.reqs:
        row = state.req_pool_idx(r)
        if row is not None:
            rows[r.rid] = int(row)
    chunked = getattr(s, "chunked_req", None)
    stats = view.stats
    try:
        locks = radix.all_lock_refs(s.tree_cache)
        tree_nodes, locked = len(locks), sum(1 for n in locks.values() if n)
    except radix.TreeNotInspectable:
        tree_nodes = locked = None
    return {
        "slot": state.pp_slot(s),
        "paused": sglang_compat.is_paused(s),
        "fully_idle": view.fully_idle,
        "batches": batches,
        "chunked": chunked.rid if chunked is not None else None,
        "waiting": waiting,
        "rows": rows,
        "rows_free": stats["req_pool_free"],
        "rows_total": stats["req_pool_total"],
        "kv_free": stats["kv_pool_free"],
        "kv_total": stats["kv_pool_total"],
        "tree_nodes": tree_nodes,
        "tree_locked": locked,
    }


def header(*, script: str, loop: str, pp_size: int, sglang_version: Optional[str],
           invariants: List[str]) -> Dict[str, Any]:
    return {"trace_format": FORMAT_VERSION, "script": script, "loop": loop, "pp_size": pp_size,
            "sglang_version": sglang_version, "invariants": invariants}


class TraceWriter:
    """Appends JSON lines to ``path`` (or keeps nothing when path is None);
    keeps the last records in memory for the failure timeline."""

    def __init__(self, path: Optional[str], keep: int = 64) -> None:
        self.path = path
        # Unbuffered binary: one write() system call per line and no flush.
        self._f = open(path, "wb", buffering=0) if path else None
        self.keep = keep
        self.recent: List[Dict[str, Any]] = []
        self.header: Dict[str, Any] = {}

    def write_header(self, head: Dict[str, Any]) -> None:
        self.header = head
        self._write(head)

    def append(self, record: Dict[str, Any]) -> None:
        self.recent.append(record)
        if len(self.recent) > 2 * self.keep:
            del self.recent[: len(self.recent) - self.keep]
        self._write(record)

    def _write(self, obj: Dict[str, Any]) -> None:
        if self._f is not None:
            self._f.write(encode_line(obj))

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
