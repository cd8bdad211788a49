"""Invariants checked once per iteration, after the script advanced and
before the scheduler ingests (scheduler process).

Each invariant is a function ``check(view, mem) -> Optional[Violation]``
over one ``StateView`` (a single scan of scheduler state shared by all
checks, so the per-iteration cost is one scan) and the run's
``InvariantMemory``, registered in ``check_registry`` with
``@check_registry.invariant(NAME, doc=...)``, as the HiCache checks
(``hicache_checks.py``), the contracts (``contracts.py``), the end check
(``output_oracle.py``) and a user's extension invariants are. All are on by
default; each can be switched off per run by name. ``InvariantChecker``
runs every registered check in the registry's order.

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
  current tree (a flush under it); an admitted live request (in a batch or
  the chunked slot) holds a lock on the prefix it matched (its ``last_node``,
  unless the root: SGLang's ``PrefillAdder`` locks it at admission and a
  checkpoint moves the lock, so eviction cannot free KV a request reads); at
  idle every non-root lock ref is 0.
* ``pool_accounting``: ``available + evictable + protected + uncached ==
  total`` (uncached = KV that live requests own outside the tree, as SGLang's
  own invariant checker counts it; KV taken by ``ctx.exhaust_kv`` counts as
  held); at idle this is ``available + evictable == total``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from scripted_runtime.hooks import sglang_compat
from scripted_runtime import extensions
from scripted_runtime.scheduler_side import check_registry, contracts, runtime_contracts, state
from scripted_runtime.scheduler_side import lora_contract  # registers after runtime_contracts: its checks run after
from scripted_runtime.scheduler_side import priority_contract  # and after lora's
from scripted_runtime.scheduler_side import admission_contract  # noqa: F401  (registers after priority's)
from scripted_runtime.scheduler_side import fill_ids_contract  # noqa: F401  (and after the admission budget)
# Imported for the checks they register: once this module is imported, every
# built-in check is in check_registry.
from scripted_runtime.scheduler_side import hicache_checks, output_oracle, request_contract  # noqa: F401
from scripted_runtime.scheduler_side import logprob_contract  # noqa: F401  (after request_contract: listed order)
from scripted_runtime.scheduler_side import answer_delivery  # noqa: F401  (after: the end checks' listed order)
from scripted_runtime.scheduler_side import weight_version_contract  # noqa: F401  (after: it reads the answers)
from scripted_runtime.scheduler_side import request_fuzz
from scripted_runtime.scheduler_side.check_registry import Violation
from scripted_runtime.scheduler_side.context import radix

check_registry.end_check(request_fuzz.NAME, doc=request_fuzz.DOC)(request_fuzz.judge)  # last: the survival contract


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
            label = h.label
            for r in h.reqs:
                k = id(r)
                if k in where:
                    where[k].append(label)
                else:
                    reqs[k] = r
                    where[k] = [label]
        self._reqs = reqs
        self._where = where
        # finished() once per request: the checks and the trace both ask
        self.done: Dict[int, bool] = {k: bool(r.finished()) for k, r in reqs.items()}
        # Live: unfinished requests anywhere except waiting ones without KV
        # (those own nothing yet, or were retracted and released it).
        done = self.done
        self.live: List[Any] = [
            r for k, r in reqs.items()
            if not done[k] and (where[k] != ["waiting_queue"] or state.holds_kv(r))
        ]
        self.nothing_held = not reqs
        self._stats: Optional[Dict[str, int]] = None

    @property
    def reqs(self) -> List[Any]:
        """Every request held anywhere, each once, finished or not."""
        return list(self._reqs.values())

    @property
    def stats(self) -> Dict[str, int]:
        """``state.pool_stats`` of this scan (read by the checks and the
        trace; taken once, at the first read: a plain attribute, since 3.11's
        ``cached_property`` takes a lock on every read)."""
        stats = self._stats
        if stats is None:
            stats = self._stats = state.pool_stats(self.s)
        return stats

    def holders_of(self, req: Any) -> List[str]:
        return self._where.get(id(req), [])

    def owner_info(self, reqs: Iterable[Any]) -> Dict[str, Any]:
        return {r.rid: {"row": state.req_pool_idx(r), "holders": self.holders_of(r)} for r in reqs}

    @property
    def idle(self) -> bool:
        """The scheduler's gate and the harness's scan agree: nothing anywhere."""
        return self.fully_idle and self.nothing_held


@dataclass
class StepInputs:
    """What one round of checks is given besides the scan (the contracts read it)."""

    step: int = 0
    batch_log: List[Any] = field(default_factory=list)  # every forward launched in the run so far
    tracked: Dict[str, Any] = field(default_factory=dict)  # rid -> the script's requests
    enabled: Callable[[str], bool] = lambda name: True  # whether the check of that name is on

    def launched_since(self, memory: Any) -> List[Any]:
        """The forwards launched since a check's own cursor into the batch
        log (``memory.batch_cursor``), moving the cursor past them."""
        launched = self.batch_log[memory.batch_cursor:]
        memory.batch_cursor = len(self.batch_log)
        return launched

    def launched_to_judge(self, memory: Any, name: str) -> List[Any]:
        """``launched_since(memory)`` for the check ``name``: the forwards
        launched since its cursor (moving it), none while it is off."""
        launched = self.launched_since(memory)
        return launched if self.enabled(name) else []


@dataclass
class BatchCursor:
    """The memory of a check that judges each launched forward once and
    nothing else (``StepInputs.launched_to_judge``): the admission budget,
    the fill ids."""

    batch_cursor: int = 0  # batch_log records judged so far


@dataclass
class InvariantMemory:
    """What a check remembers across iterations of one run, and this
    iteration's inputs (``step_inputs``, set by the checker)."""

    # rid -> (row at first chunk, the request's retraction count then): a retract gives the row
    # back (Req.reset_for_retract) and the re-prefill takes a new one, possibly in the same iteration
    chunked_rows: Dict[str, Tuple[Any, int]] = field(default_factory=dict)
    free_rows: "FreeRowsCache" = field(default_factory=lambda: FreeRowsCache())
    free_kv: "KvFreeCounts" = field(default_factory=lambda: KvFreeCounts())
    rows: "RowTable" = field(default_factory=lambda: RowTable())
    contracts: contracts.ContractMemory = field(default_factory=contracts.ContractMemory)
    runtime: runtime_contracts.RuntimeMemory = field(default_factory=runtime_contracts.RuntimeMemory)
    lora: lora_contract.LoraMemory = field(default_factory=lora_contract.LoraMemory)
    priority: priority_contract.PriorityMemory = field(default_factory=priority_contract.PriorityMemory)
    admission: BatchCursor = field(default_factory=BatchCursor)  # admission_contract's
    fill_ids: BatchCursor = field(default_factory=BatchCursor)  # fill_ids_contract's
    step_inputs: StepInputs = field(default_factory=StepInputs)

    def free_kv_counts(self, s: Any) -> Any:
        """Per KV index, how often it is in the allocator's free list (a numpy
        array, cached across iterations), or None where the release hides it."""
        allocator = s.token_to_kv_pool_allocator
        parts = sglang_compat.allocator_free_index_parts(allocator)
        if not parts:
            return None
        # KV indices run to the pool size plus a page (index 0 is padding).
        page_size = getattr(allocator, "page_size", 1) or 1
        return self.free_kv.update(parts, (getattr(allocator, "size", 0) or 0) + 2 * page_size + 1)


class FreeRowsCache:
    """The req_to_token free list as a set, rebuilt only when the list
    changed. Building the set is most of the slot-ownership cost (a 2048-row
    list, every iteration), while the list changes only when a request takes
    or gives back a row. "Changed" is exact: another list object, or the
    same object no longer equal to the copy taken at the last rebuild (a
    list compare of identical small ints is ~7x cheaper than summing it)."""

    def __init__(self) -> None:
        self._list: Optional[list] = None
        self._copy: list = []
        self.rows: frozenset = frozenset()
        self.duplicates: List[int] = []

    def update(self, free_list: list) -> "FreeRowsCache":
        if free_list is self._list and free_list == self._copy:
            return self
        rows = frozenset(free_list)
        self.duplicates = (sorted({x for x in free_list if free_list.count(x) > 1})[:8]
                           if len(rows) != len(free_list) else [])
        self._list, self._copy, self.rows = free_list, list(free_list), rows
        return self


class KvFreeCounts:
    """How often each KV index sits in the allocator's free list (its
    ``free_pages`` and ``release_pages`` parts), kept across iterations.

    SGLang never writes these tensors in place: ``alloc`` takes a suffix view
    (``free_pages[n:]``) and ``free`` concatenates a new tensor (see
    ``sglang_compat.allocator_free_index_parts``). A part whose memory starts
    k elements into the part seen last time and ends where it ended is that
    part minus its first k indices (the old tensor is held, so its memory
    cannot have been reused: only a view of it can start there), and only
    those k are uncounted; any other change recounts. A decode step is one
    pop instead of re-marking all ~8k free indices; this runs after every
    forward, on cold caches, so it keeps to a few calls."""

    def __init__(self) -> None:
        self.counts = None  # a numpy array indexed by KV index
        # per part: (tensor held, its numpy view, data_ptr, numel, element size)
        self._parts: List[Tuple[Any, Any, int, int, int]] = []

    def update(self, parts: List[Any], size_hint: int = 0) -> Any:
        """The counts for these parts (an array at least ``size_hint`` long)."""
        if self.counts is None or len(parts) != len(self._parts):
            return self._rebuild(parts, size_hint)
        for i, new in enumerate(parts):
            old, old_np, ptr, numel, esize = self._parts[i]
            if new is old:
                continue
            k = numel - new.numel()
            if k < 0 or new.data_ptr() != ptr + k * esize:
                return self._rebuild(parts, size_hint)
            if k == 1:
                self.counts[old_np[0]] -= 1  # a decode step: no ufunc.at machinery
            elif k:
                import numpy as np

                np.subtract.at(self.counts, old_np[:k], 1)
            # new is old[k:]: its view and address follow without asking torch
            self._parts[i] = (new, old_np[k:], ptr + k * esize, numel - k, esize)
        return self.counts

    def _rebuild(self, parts: List[Any], size_hint: int) -> Any:
        import numpy as np  # numpy indexing is ~25x faster than torch.isin here (bench/invariants.py)

        self._parts = [_part(p) for p in parts]
        arrays = [entry[1] for entry in self._parts if entry[3]]
        if not arrays:
            self.counts = np.zeros(max(size_hint, 1), dtype=np.int64)
            return self.counts
        flat = np.concatenate(arrays) if len(arrays) > 1 else arrays[0]
        self.counts = np.bincount(flat, minlength=size_hint)
        return self.counts


def _part(t: Any) -> Tuple[Any, Any, int, int, int]:
    view = t.numpy() if t.device.type == "cpu" else t.cpu().numpy()
    return (t, view, t.data_ptr(), t.numel(), t.element_size())


class RowTable:
    """``req_to_token`` as numpy rows: on CPU a view kept while the tensor
    object stays the same (slicing the view is ~10x cheaper than slicing the
    tensor); on a device, the row is copied to the host."""

    def __init__(self) -> None:
        self._tensor = None
        self._view = None

    def row(self, table: Any, row: int, n: int) -> Any:
        if table is not self._tensor:
            self._tensor = table
            self._view = table.numpy() if table.device.type == "cpu" else None
        if self._view is not None:
            return self._view[row, :n]
        return table[row, :n].cpu().numpy()


@check_registry.invariant("idle_gate", doc="whenever is_fully_idle() says idle, the harness's complete scan finds "
                                            "no live request")
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


@check_registry.invariant("slot_ownership", doc="live owners hold distinct rows, none of them free, and no KV "
                                                 "index of a live row is free")
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
        retractions = _retractions(chunked)
        first, then = mem.chunked_rows.setdefault(chunked.rid, (row, retractions))
        if retractions != then:  # retracted and prefilled again since: a new first chunk, a new row
            mem.chunked_rows[chunked.rid] = (row, retractions)
        elif row != first:
            return Violation("slot_ownership",
                             f"chunked request {chunked.rid} moved from row {first} to row {row} "
                             "between chunks (PR 17850: its old row may be handed to another request)",
                             v.owner_info([chunked]))
    live_by_rid = {r.rid: r for r in v.live}
    for rid, (first, then) in list(mem.chunked_rows.items()):
        if chunked is not None and rid == chunked.rid:
            continue
        del mem.chunked_rows[rid]  # done chunking (or gone): check its row once more
        req = live_by_rid.get(rid)
        row = state.req_pool_idx(req) if req is not None else None
        if row is not None and row != first and _retractions(req) == then:
            return Violation("slot_ownership",
                             f"request {rid} left chunking in row {row}, not its first-chunk row "
                             f"{first}", v.owner_info([req]))
    return _check_kv_not_free(v, by_row, mem)


def _retractions(req: Any) -> int:
    """How often SGLang retracted ``req`` (``Req.retraction_count``, 0 where a
    release does not count them)."""
    return int(getattr(req, "retraction_count", 0) or 0)


def _check_kv_not_free(v: StateView, by_row: Dict[int, List[Any]], mem: InvariantMemory) -> Optional[Violation]:
    if not by_row:
        return None
    counts = mem.free_kv_counts(v.s)
    if counts is None:
        return None
    import numpy as np  # lazily: the harness process reads this module too

    table = v.s.req_to_token_pool.req_to_token
    # Every live row's KV indices in one array, looked up in one take: three
    # numpy calls an iteration, not three a row (the rows are read right after
    # a forward, on cold caches, where each call costs ~10x its warm time).
    held = []  # (the row's owner, its KV indices)
    for row, owners in by_row.items():
        n = state.kv_allocated_len(owners[0])
        if n > 0:
            held.append((owners[0], mem.rows.row(table, row, n)))
    if not held:
        return None
    idx = np.concatenate([i for _, i in held]) if len(held) > 1 else held[0][1]
    try:
        free_now = counts.take(idx)
    except IndexError:  # an index past every free one cannot be free
        idx = idx[idx < len(counts)]
        free_now = counts.take(idx)
    if not np.count_nonzero(free_now):  # ~3x cheaper than .any() on a few hundred
        return None
    for req, idx in held:  # the failing iteration only: which row holds a free index
        idx = idx[idx < len(counts)]
        bad = idx[counts.take(idx) > 0]
        if len(bad):
            return Violation("slot_ownership",
                             f"KV indices {bad[:6].tolist()} of live request {req.rid} (row {state.req_pool_idx(req)}) "
                             "are in the allocator's free list", v.owner_info([req]))
    return None


@check_registry.invariant("radix_locks", doc="no live request holds a node of a vanished tree; an admitted "
                                              "request's matched prefix is locked; at idle no node is locked")
def check_radix_locks(v: StateView, mem: InvariantMemory) -> Optional[Violation]:
    tree = v.s.tree_cache
    root = None
    for r in v.live:
        node = getattr(r, "last_node", None)
        if node is None:
            continue
        if not radix.in_current_tree(tree, node):
            return Violation("radix_locks",
                             f"live request {r.rid} holds tree node {radix.node_label(node)} that is not "
                             "in the current tree (the tree was reset under it)", v.owner_info([r]))
        if v.holders_of(r) == ["waiting_queue"]:
            continue  # matched, not admitted: nothing is locked for it yet
        if root is None:
            root = radix.root_of(tree)
        if radix.resolve(tree, node) is not root and radix.node_lock_ref(tree, node) <= 0:
            return Violation("radix_locks",
                             f"admitted request {r.rid} reads the prefix up to tree node {radix.node_label(node)}, "
                             "which is not locked: eviction may free that KV under it", v.owner_info([r]))
    if v.idle:
        locked = {k: n for k, n in radix.all_lock_refs(tree).items() if n}
        if locked:
            sample = dict(list(locked.items())[:6])
            return Violation("radix_locks", f"idle, yet {len(locked)} tree node(s) still locked: {sample}")
    return None


@check_registry.invariant("pool_accounting", doc="available + evictable + protected + uncached == total KV")
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


# Every built-in check is registered by now (this module imports those that define them).
INVARIANT_NAMES = check_registry.names("invariant", "hicache")
CONTRACT_NAMES = check_registry.names("contract")
# Checked once, at a program's end-state check (scheduler_side/output_oracle.py),
# switched on and off like the others.
END_CHECK_NAMES = check_registry.names("end_check")
NAMES = check_registry.names()


def all_names() -> Tuple[str, ...]:
    """The built-in checks, then the loaded extension invariants
    (``scripted_runtime/extensions.py``); one named like a built-in check
    is an ``ExtensionError``."""
    loaded = tuple(check_registry.extension_checks())
    clash = sorted(set(loaded) & set(NAMES))
    if clash:
        raise extensions.ExtensionError(f"extension invariant {clash[0]!r}: a built-in check has that name")
    return NAMES + loaded


def validate_names(names: Iterable[str]) -> Tuple[str, ...]:
    names = tuple(names)
    known = all_names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown invariant(s) {unknown}; known: {', '.join(known)}")
    return names


class InvariantChecker:
    def __init__(self, disabled: Iterable[str] = ()) -> None:
        self.reset(disabled)

    def reset(self, disabled: Iterable[str] = ()) -> None:
        self.disabled = set(validate_names(disabled))
        self.memory = InvariantMemory()
        self._runs_cache: Optional[Tuple[Any, List[check_registry.Run]]] = None

    @property
    def enabled(self) -> List[str]:
        return [n for n in all_names() if n not in self.disabled]

    def is_enabled(self, name: str) -> bool:
        return name not in self.disabled

    @property
    def contracts_enabled(self) -> bool:
        return any(n not in self.disabled for n in CONTRACT_NAMES)

    @property
    def per_iteration(self) -> bool:
        """Whether anything is checked after each iteration."""
        return bool(self._runs())

    def _runs(self) -> List[check_registry.Run]:
        """The run of every enabled per-iteration check, in the registry's
        order, each once (the contracts share one). Built once per run and
        again only when a check registers meanwhile (read twice an
        iteration: rebuilding it cost ~8 us each time)."""
        version = check_registry.version()
        cached = self._runs_cache
        if cached is not None and cached[0] == version:
            return cached[1]
        runs: List[check_registry.Run] = []
        for c in check_registry.builtin_checks() + list(check_registry.extension_checks().values()):
            if c.run is not None and c.name not in self.disabled and c.run not in runs:
                runs.append(c.run)
        self._runs_cache = (version, runs)
        return runs

    def check(self, view: StateView, *, step: int = 0, batch_log: Optional[List[Any]] = None,
              tracked: Optional[Dict[str, Any]] = None) -> Optional[Violation]:
        memory = self.memory
        memory.step_inputs = StepInputs(step, batch_log or [], tracked or {}, self.is_enabled)
        for run in self._runs():
            violation = run(view, memory)
            if violation is not None:
                return violation
        return None
