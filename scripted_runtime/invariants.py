"""Invariants checked once per iteration, after the script advanced and
before the scheduler ingests (scheduler process).

Each invariant is a function ``check(view) -> Optional[Violation]`` over one
``StateView`` (a single scan of scheduler state shared by all checks, so the
per-iteration cost is one scan). All are on by default; each can be switched
off per run by name.

* ``idle_gate``: whenever the scheduler's own idle gate (``is_fully_idle``,
  what ``flush_cache`` trusts) says idle, the harness's complete scan (all PP
  slots, ``result_queue``, ``chunked_req``, waiting requests holding KV)
  finds no live request (PR 27446: the flush is wrong the moment it is
  accepted).
* ``slot_ownership``: live owners hold distinct ``req_pool_idx``; no owned
  row is in the free list; the free list has no duplicates; a chunked request
  keeps its row from first chunk to release; no KV index of a live row is in
  the allocator's free list.
* ``radix_locks``: no live request holds a tree node that is no longer in the
  current tree (a flush under it); at idle every non-root lock ref is 0.
* ``pool_accounting``: ``available + evictable + protected + uncached ==
  total`` (uncached = KV that live requests own outside the tree, as SGLang's
  own invariant checker counts it; KV taken by ``ctx.exhaust_kv`` counts as
  held); at idle this is ``available + evictable == total``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from hooks import sglang_compat
from scripted_runtime import state
from scripted_runtime.context import radix

NAMES = ("idle_gate", "slot_ownership", "radix_locks", "pool_accounting")


@dataclass
class Violation:
    invariant: str
    message: str
    owners: Dict[str, Any] = field(default_factory=dict)  # rid -> {"row":..,"holders":[..]}
    iteration: Optional[int] = None
    step: Optional[int] = None

    def headline(self) -> str:
        where = f" at step {self.step}" if self.step is not None else ""
        return f"InvariantViolation[{self.invariant}]{where}: {self.message}"

    def as_dict(self) -> Dict[str, Any]:
        return {"invariant": self.invariant, "message": self.message, "owners": self.owners,
                "iteration": self.iteration, "step": self.step}


class StateView:
    """One scan of the scheduler, shared by every check of an iteration."""

    def __init__(self, s: Any, *, extra_held_tokens: int = 0) -> None:
        self.s = s
        self.holders = state.holders(s)
        self.loop = sglang_compat.loop_kind(s)
        self.fully_idle = sglang_compat.is_fully_idle(s)
        self.extra_held_tokens = extra_held_tokens
        reqs: Dict[int, Any] = {}
        where: Dict[int, List[str]] = {}
        for h in self.holders:
            for r in h.reqs:
                reqs.setdefault(id(r), r)
                where.setdefault(id(r), []).append(h.label)
        self._reqs = reqs
        self._where = where
        # Live: unfinished requests anywhere except waiting ones without KV
        # (those own nothing yet, or were retracted and released it).
        self.live: List[Any] = [
            r for k, r in reqs.items()
            if not r.finished() and (where[k] != ["waiting_queue"] or state.holds_kv(r))
        ]
        self.nothing_held = not reqs

    @property
    def reqs(self) -> List[Any]:
        """Every request held anywhere, each once, finished or not."""
        return list(self._reqs.values())

    @functools.cached_property
    def stats(self) -> Dict[str, int]:
        """``state.engine_stats`` of this scan (read by the checks and the trace)."""
        return state.engine_stats(self.s)

    def holders_of(self, req: Any) -> List[str]:
        return self._where.get(id(req), [])

    def owner_info(self, reqs: Iterable[Any]) -> Dict[str, Any]:
        return {r.rid: {"row": state.req_pool_idx(r), "holders": self.holders_of(r)} for r in reqs}

    @property
    def idle(self) -> bool:
        """The scheduler's gate and the harness's scan agree: nothing anywhere."""
        return self.fully_idle and self.nothing_held


Check = Callable[[StateView, "InvariantMemory"], Optional[Violation]]


@dataclass
class InvariantMemory:
    """What a check remembers across iterations of one run."""

    chunked_rows: Dict[str, int] = field(default_factory=dict)  # rid -> row at first chunk
    free_rows: "FreeRowsCache" = field(default_factory=lambda: FreeRowsCache())


class FreeRowsCache:
    """The req_to_token free list as a set, rebuilt only when the list
    changed. Building the set is most of the slot-ownership cost (a 2048-row
    list, every iteration), while the list changes only when a request takes
    or gives back a row. "Changed" is: another list object (SGLang's alloc
    slices a new one; the cache holds the old one, so its address cannot be
    reused), another length (a free appends), or another sum (an in-place
    overwrite). The same multiset in another order cannot add a duplicate or
    a row, so it needs no rebuild."""

    def __init__(self) -> None:
        self._list: Optional[list] = None
        self._key: Tuple[int, int] = (-1, -1)
        self.rows: frozenset = frozenset()
        self.duplicates: List[int] = []

    def update(self, free_list: list) -> "FreeRowsCache":
        key = (len(free_list), sum(free_list))
        if free_list is self._list and key == self._key:
            return self
        rows = frozenset(free_list)
        self.duplicates = (sorted({x for x in free_list if free_list.count(x) > 1})[:8]
                           if len(rows) != len(free_list) else [])
        self._list, self._key, self.rows = free_list, key, rows
        return self


def check_idle_gate(v: StateView, mem: InvariantMemory) -> Optional[Violation]:
    if not v.fully_idle or not v.live:
        return None
    return Violation(
        "idle_gate",
        f"is_fully_idle() says idle but {len(v.live)} live request(s) are held: "
        + "; ".join(f"{r.rid} in {'+'.join(v.holders_of(r))}" for r in v.live[:6])
        + " (a flush_cache accepted now would reset the pools under them)",
        v.owner_info(v.live),
    )


def check_slot_ownership(v: StateView, mem: InvariantMemory) -> Optional[Violation]:
    pool = v.s.req_to_token_pool
    free_list = getattr(pool, "free_slots", None)
    if not isinstance(free_list, list):
        free_list = list(free_list or ())  # a new list each time: the cache rebuilds, still correct
    free = mem.free_rows.update(free_list)
    if free.duplicates:
        return Violation("slot_ownership", f"req_to_token free list has duplicate rows {free.duplicates}")
    free_set = free.rows
    by_row: Dict[int, List[Any]] = {}
    for r in v.live:
        row = state.req_pool_idx(r)
        if row is not None:
            by_row.setdefault(int(row), []).append(r)
    for row, owners in by_row.items():
        if len({r.rid for r in owners}) > 1:
            return Violation("slot_ownership",
                             f"row {row} is owned by {len(owners)} live requests: {_rids(owners)}",
                             v.owner_info(owners))
        if row in free_set:
            return Violation("slot_ownership",
                             f"row {row} of live request {owners[0].rid} is in the free list",
                             v.owner_info(owners))
    chunked = getattr(v.s, "chunked_req", None)
    if chunked is not None and chunked.finished():
        chunked = None
    if chunked is not None:
        row = state.req_pool_idx(chunked)
        first = mem.chunked_rows.setdefault(chunked.rid, row)
        if row != first:
            return Violation("slot_ownership",
                             f"chunked request {chunked.rid} moved from row {first} to row {row} "
                             "between chunks (PR 17850: its old row may be handed to another request)",
                             v.owner_info([chunked]))
    live_by_rid = {r.rid: r for r in v.live}
    for rid, first in list(mem.chunked_rows.items()):
        if chunked is not None and rid == chunked.rid:
            continue
        del mem.chunked_rows[rid]  # done chunking (or gone): check its row once more
        req = live_by_rid.get(rid)
        row = state.req_pool_idx(req) if req is not None else None
        if row is not None and row != first:
            return Violation("slot_ownership",
                             f"request {rid} left chunking in row {row}, not its first-chunk row "
                             f"{first}", v.owner_info([req]))
    return _check_kv_not_free(v, by_row)


def _check_kv_not_free(v: StateView, by_row: Dict[int, List[Any]]) -> Optional[Violation]:
    if not by_row:
        return None
    allocator = v.s.token_to_kv_pool_allocator
    parts = sglang_compat.allocator_free_index_parts(allocator)
    if not parts:
        return None
    import numpy as np  # a numpy mask is ~25x faster than torch.isin here (bench/invariants.py)

    free_np = [p.cpu().numpy() for p in parts if p.numel()]
    if not free_np:
        return None
    table = v.s.req_to_token_pool.req_to_token
    if table.device.type == "cpu":
        table = table.numpy()  # a view; slicing it is ~10x cheaper than slicing the tensor
        rows_of = lambda row, n: table[row, :n]  # noqa: E731
    else:
        rows_of = lambda row, n: table[row, :n].cpu().numpy()  # noqa: E731
    held = []
    for row, owners in by_row.items():
        n = state.kv_allocated_len(owners[0])
        if n > 0:
            held.append((owners[0], rows_of(row, n)))
    if not held:
        return None
    # KV indices run to the pool size plus a page (index 0 is padding); the
    # exact maximum costs two reductions per iteration, so it is only taken
    # when something lies beyond that.
    page_size = int(getattr(allocator, "page_size", 1) or 1)
    size = int(getattr(allocator, "size", 0) or 0) + 2 * page_size + 1
    try:
        return _kv_in_free(np.zeros(size, dtype=bool), free_np, held, v)
    except IndexError:
        size = int(max(max(int(f.max()) for f in free_np), max(int(idx.max()) for _, idx in held))) + 1
        return _kv_in_free(np.zeros(size, dtype=bool), free_np, held, v)


def _kv_in_free(mask, free_np, held, v: StateView) -> Optional[Violation]:
    for f in free_np:
        mask[f] = True
    for req, idx in held:
        bad = idx[mask[idx]]
        if bad.size:
            return Violation("slot_ownership",
                             f"KV indices {bad[:6].tolist()} of live request {req.rid} (row {state.req_pool_idx(req)}) "
                             "are in the allocator's free list", v.owner_info([req]))
    return None


def check_radix_locks(v: StateView, mem: InvariantMemory) -> Optional[Violation]:
    tree = v.s.tree_cache
    for r in v.live:
        node = getattr(r, "last_node", None)
        if node is None:
            continue
        if not radix.in_current_tree(tree, node):
            return Violation("radix_locks",
                             f"live request {r.rid} holds tree node {radix.node_label(node)} that is not "
                             "in the current tree (the tree was reset under it)", v.owner_info([r]))
    if v.idle:
        locked = {k: n for k, n in radix.all_lock_refs(tree).items() if n}
        if locked:
            sample = dict(list(locked.items())[:6])
            return Violation("radix_locks", f"idle, yet {len(locked)} tree node(s) still locked: {sample}")
    return None


def check_pool_accounting(v: StateView, mem: InvariantMemory) -> Optional[Violation]:
    s = v.s
    stats = v.stats
    total = int(getattr(s, "max_total_num_tokens", 0) or stats["kv_pool_total"])
    available = stats["kv_pool_free"]
    evictable = stats["evictable"]
    held = v.extra_held_tokens
    if v.idle:
        if available + evictable + held != total:
            return Violation("pool_accounting",
                             f"idle, yet available {available} + evictable {evictable}"
                             + (f" + script-held {held}" if held else "")
                             + f" != total {total} (leaked {total - available - evictable - held} tokens)")
        return None
    owners = [r for r in v.reqs if state.holds_kv(r)]
    uncached = sglang_compat.uncached_tokens(owners, stats["page_size"])
    if uncached is None:
        return None  # this release does not expose what the busy form needs
    protected = stats["protected"]
    accounted = available + evictable + protected + uncached + held
    if accounted != total:
        return Violation("pool_accounting",
                         f"available {available} + evictable {evictable} + protected {protected} + "
                         f"uncached {uncached}" + (f" + script-held {held}" if held else "")
                         + f" = {accounted} != total {total}", v.owner_info(owners))
    return None


def _rids(reqs) -> str:
    return ",".join(r.rid for r in reqs)


CHECKS: Dict[str, Check] = {
    "idle_gate": check_idle_gate,
    "slot_ownership": check_slot_ownership,
    "radix_locks": check_radix_locks,
    "pool_accounting": check_pool_accounting,
}


def validate_names(names: Iterable[str]) -> Tuple[str, ...]:
    names = tuple(names)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise ValueError(f"unknown invariant(s) {unknown}; known: {', '.join(NAMES)}")
    return names


class InvariantChecker:
    def __init__(self, disabled: Iterable[str] = ()) -> None:
        self.disabled = set(validate_names(disabled))
        self.memory = InvariantMemory()

    def reset(self, disabled: Iterable[str] = ()) -> None:
        self.disabled = set(validate_names(disabled))
        self.memory = InvariantMemory()

    @property
    def enabled(self) -> List[str]:
        return [n for n in NAMES if n not in self.disabled]

    def check(self, view: StateView) -> Optional[Violation]:
        for name in NAMES:
            if name in self.disabled:
                continue
            violation = CHECKS[name](view, self.memory)
            if violation is not None:
                return violation
        return None
