"""Builds one step-trace record per iteration and appends it to a JSONL file
(scheduler process). One record describes iteration N: the forwards it
launched and the control answers it produced, the state it left behind,
the windows open and the invariant verdict at the start of iteration N+1,
and the operations the script injected right after (processed in N+1).

Every line is in the file's pages as soon as it is appended (a shared
memory map, ``TraceWriter``), so a scheduler crash leaves the trace up to
the step before it.
"""
from __future__ import annotations

import errno
import json
import mmap
import os
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
            batches[holder.label] = {"mode": state.batch_mode(holder.batch), "rids": rids}
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
    keeps the last records in memory for the failure timeline.

    The file is written through shared memory maps, not a ``write()`` per
    line: a line is a copy into the page cache, where a system call after
    each iteration's forward cost ~19 us (``bench/iteration_cost.py``).
    What is copied there is the file's whatever happens to the process
    after (a crash, SIGKILL), so a scheduler crash still leaves the trace up
    to the step before it. The file is mapped a block at a time ahead of
    its text (64 KiB, doubling to 1 MiB), each block allocated up front
    (``posix_fallocate``: a full disk is an ``OSError`` here, not a SIGBUS
    on a page fault later) and its pages faulted in at once
    (``MAP_POPULATE``: ~1.6 us a page, against ~18 us for a fault on first
    touch on this project's VM). ``close()`` cuts the file to its text. A
    process killed before ``close()`` leaves NUL bytes after the last line:
    ``scripted_runtime.timeline.seal`` cuts them (the harness does it when it
    collects a crashed run's trace), ``timeline.load`` ignores them."""

    FIRST_BLOCK = 1 << 16
    MAX_BLOCK = 1 << 20

    def __init__(self, path: Optional[str], keep: int = 64) -> None:
        self.path = path
        self._fd: Optional[int] = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644) if path else None
        self._map: Optional[mmap.mmap] = None
        self._map_start = 0  # file offset of the mapped block
        self._pos = 0  # bytes of text written
        self._size = 0  # file offset where the mapped block ends
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
        if self._fd is None:
            return
        line = encode_line(obj)
        pos = self._pos
        end = pos + len(line)
        if end <= self._size:  # the usual case: the line fits in the block
            offset = pos - self._map_start
            self._map[offset:offset + len(line)] = line
            self._pos = end
            return
        rest = memoryview(line)
        while rest:
            if self._pos == self._size:
                self._next_block()
            chunk = rest[:self._size - self._pos]
            offset = self._pos - self._map_start
            self._map[offset:offset + len(chunk)] = chunk
            self._pos += len(chunk)
            rest = rest[len(chunk):]

    def _next_block(self) -> None:
        size = min(2 * (self._size - self._map_start), self.MAX_BLOCK) if self._map is not None else self.FIRST_BLOCK
        start = self._size
        _allocate(self._fd, start, size)
        if self._map is not None:
            self._map.close()
            self._map = None
        self._map = mmap.mmap(self._fd, size, flags=mmap.MAP_SHARED | _POPULATE, offset=start)
        self._map_start, self._size = start, start + size

    def close(self) -> None:
        """Unmap and cut the file to its text (idempotent)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        if self._map is not None:
            self._map.close()
            self._map = None
        try:
            os.ftruncate(fd, self._pos)
        finally:
            os.close(fd)


_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux; elsewhere pages fault in on first touch


def _allocate(fd: int, start: int, size: int) -> None:
    """Give the file its next block on disk (``posix_fallocate``: a full disk
    is an ``OSError`` here); where the file system or platform cannot, only
    extend the file (a full disk would then show at a page fault)."""
    try:
        os.posix_fallocate(fd, start, size)
    except AttributeError:  # no posix_fallocate on this platform
        os.ftruncate(fd, start + size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, start + size)
