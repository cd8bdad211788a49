"""KV pressure on every rank: harness operations that ride SGLang's own
request relay, so each rank applies them to its own pools at the same point
of the same iteration.

Under pipeline parallelism every rank keeps its own KV allocator and radix
tree and schedules on them; the ranks agree on every batch only because
they see the same requests at the same iterations and their pools evolve
alike (SGLang relays what rank 0 received down the pipeline,
``event_loop_pp``: ingest, relay, schedule). Taking KV slots on the driver
rank alone would make rank 0 refuse what the others admit. So under PP the
script's ``exhaust_kv`` / ``evict_cache`` / ``release_exhausted_kv`` are
sent as a ``RankKvOp`` queued in the driver rank's input (the tokenizer
inbox, behind what has arrived); rank 0 relays it with the iteration's
requests and every rank's dispatcher applies it when it comes to it, before
the iteration schedules: a take leaves the same number of free tokens on
every rank (``leave_tokens``), whatever each rank held before.

The driver rank applies the operations in its own dispatcher
(``driver.Driver``); every other rank runs a ``RankAgent`` (installed by
``hooks/scheduler_hook.py`` at its first iteration). Off PP the driver takes
and gives back at once, as before.
"""
from __future__ import annotations

import importlib
import pickle
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from scripted_runtime.hooks import sglang_compat
from scripted_runtime.scheduler_side import memory_occupation, state
from scripted_runtime.scheduler_side.kv_holds import KvHolds

TAKE, RELEASE, EVICT = "take", "release", "evict"


@dataclass
class RankKvOp:
    """One harness KV operation for every rank (pickled down the pipeline
    with the requests). ``take``: hold every free token but
    ``leave_tokens``; ``release``: give back everything held; ``evict``:
    evict the radix tree's evictable KV to the allocator."""

    kind: str
    leave_tokens: int = 0
    serial: int = 0  # the driver's count, to match the op it queued


def frame(op: RankKvOp) -> bytes:
    """``op`` as a frame of the tokenizer's socket (pickle IPC: SGLang's
    default; the msgpack IPC has no type for it)."""
    io = importlib.import_module(sglang_compat.IO_STRUCT_MODULE)
    if getattr(io, "_USE_PICKLE_IPC", True) is False:
        raise RuntimeError("KV pressure under pipeline parallelism needs SGLang's pickle IPC "
                           "(SGLANG_USE_PICKLE_IPC=1, the default): the msgpack IPC has no type for "
                           "the harness's per-rank operation")
    return pickle.dumps(op, protocol=pickle.HIGHEST_PROTOCOL)


def apply(scheduler: Any, holds: KvHolds, op: RankKvOp) -> int:
    """Apply ``op`` to this rank's pools; returns the tokens it took, gave
    back or evicted. Never raises into SGLang's loop for a refusal: a take
    the allocator refuses takes nothing (every rank refuses alike, their
    pools being alike)."""
    if op.kind == TAKE:
        need = int(scheduler.token_to_kv_pool_allocator.available_size()) - op.leave_tokens
        return need if need > 0 and holds.take(need) else 0
    if op.kind == RELEASE:
        tokens = holds.tokens
        holds.release()
        return tokens
    if op.kind == EVICT:
        return sglang_compat.evict_cache(scheduler, state.pool_stats(scheduler)["evictable"])
    raise ValueError(f"unknown rank KV operation {op.kind!r}")


class RankAgent:
    """What a rank other than the driver's runs: its own KV holds, and a
    dispatcher that applies ``RankKvOp``s and hands everything else to
    SGLang's."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.holds = KvHolds(scheduler)
        sglang_compat.wrap_request_dispatcher(scheduler, self._dispatching)

    def _dispatching(self, dispatcher):
        def dispatch(recv_req: Any) -> Optional[Any]:
            if isinstance(recv_req, RankKvOp):
                apply(self.scheduler, self.holds, recv_req)
                return None
            output = dispatcher(recv_req)
            memory_occupation.after_dispatch(self.scheduler, recv_req, output)
            # the driver rank's reset flush (its marker, not the type alone: the driver restarts only
            # at the flush it queued itself): the same restart here
            if sglang_compat.is_reset_flush(recv_req, marked=True):
                sglang_compat.restart_policy_call_counters(self.scheduler)
            return output

        dispatch.__wrapped__ = dispatcher
        return dispatch


class KvPressure:
    """The driver rank's side of a script's KV pressure (``ctx.exhaust_kv``,
    ``ctx.evict_cache``, ``ctx.release_exhausted_kv``, the reset's give-back):
    off PP applied to this rank's pools at once; under PP queued as a
    ``RankKvOp`` in the driver rank's input, applied by every rank (this one
    in the driver's dispatcher, ``on_dispatch``) when the next iteration
    ingests it, before it schedules."""

    def __init__(self, scheduler: Any, inbox: Any, *, pipelined: bool) -> None:
        self.scheduler = scheduler
        self.holds = KvHolds(scheduler)
        self.pipelined = pipelined
        self._inbox = inbox
        self._pending: List[Tuple[RankKvOp, int]] = []  # queued here, not dispatched yet; tokens expected
        self._serial = 0

    @property
    def tokens(self) -> int:
        """KV tokens held on this rank now (what its pools' accounting counts)."""
        return self.holds.tokens

    @property
    def holding(self) -> bool:
        """Anything held, or queued to be taken (the reset must then drain)."""
        return self.holds.holding or bool(self._pending)

    @property
    def pending(self) -> bool:
        """Whether an operation queued for the ranks has not reached this
        rank's dispatcher yet (never off PP)."""
        return bool(self._pending)

    @property
    def promised_tokens(self) -> int:
        """What is held once the queued operations are applied: what a script
        sees as ``ctx.exhausted_kv_tokens``."""
        tokens = self.holds.tokens
        for op, expected in self._pending:
            if op.kind == TAKE:
                tokens += expected
            elif op.kind == RELEASE:
                tokens = 0
        return tokens

    def take(self, leave_tokens: int) -> int:
        """Hold every free KV token but ``leave_tokens``; returns the tokens
        taken (under PP: to be taken at the next ingest, by every rank)."""
        allocator = self.scheduler.token_to_kv_pool_allocator
        if not self.pipelined:
            need = int(allocator.available_size()) - leave_tokens
            if need <= 0:
                return 0
            if not self.holds.take(need):
                raise RuntimeError(f"exhaust_kv: the allocator refused {need} tokens")
            return need
        freed = sum(expected for op, expected in self._pending if op.kind == EVICT)
        expected = max(0, int(allocator.available_size()) + freed - leave_tokens)
        self._queue(RankKvOp(TAKE, leave_tokens=leave_tokens), expected)
        return expected

    def evict(self) -> int:
        """Evict the radix tree's evictable KV to the allocator; returns the
        tokens evicted (under PP: to be evicted at the next ingest)."""
        if not self.pipelined:
            return apply(self.scheduler, self.holds, RankKvOp(EVICT))
        evictable = state.pool_stats(self.scheduler)["evictable"]
        self._queue(RankKvOp(EVICT), evictable)
        return evictable

    def release(self) -> int:
        """Give back everything held, or queued to be taken; returns the
        tokens given back (under PP: at the next ingest). Nothing held and
        nothing queued: 0, and nothing is done, so a caller need not ask
        first."""
        if not self.holding:
            return 0
        if not self.pipelined:
            return apply(self.scheduler, self.holds, RankKvOp(RELEASE))
        tokens = self.promised_tokens
        self._queue(RankKvOp(RELEASE), tokens)
        return tokens

    def _queue(self, op: RankKvOp, expected: int) -> None:
        self._serial += 1
        op.serial = self._serial
        self._inbox.inject(frame(op), op)
        self._pending.append((op, expected))

    def on_dispatch(self, op: RankKvOp) -> int:
        """The driver rank's dispatcher met ``op``: apply it here."""
        self._pending = [(p, e) for p, e in self._pending if p.serial != op.serial]
        return apply(self.scheduler, self.holds, op)
