"""The driver's parts, wired as the driver wires them, on a fake scheduler
(pure logic): the script context, the request handles and the step
observer read one RunCounters, one RequestTracker and one KvPressure."""
from __future__ import annotations

import torch

from scripted_runtime.scheduler_side.context.api import ScriptContext
from scripted_runtime.scheduler_side.context.requests import ReqHandle
from scripted_runtime.scheduler_side.control import ControlLedger
from scripted_runtime.scheduler_side.http_poster import HttpAnswer
from scripted_runtime.scheduler_side.rank_ops import KvPressure
from scripted_runtime.scheduler_side.request_tracker import RequestTracker
from scripted_runtime.scheduler_side.run_counters import BatchRecord, RunCounters
from scripted_runtime.scheduler_side.step_observer import StepObserver
from scripted_runtime.scheduler_side.weight_trainer import WeightTrainer
from tests.fakes import TOTAL, FakeReq, FakeScheduler


def _allocating(s):
    alloc = s.token_to_kv_pool_allocator

    def take(n):
        if n > len(alloc.free_pages):
            return None
        out, alloc.free_pages = alloc.free_pages[:n], alloc.free_pages[n:]
        return out

    alloc.alloc = take
    alloc.free = lambda t: setattr(alloc, "free_pages", torch.cat([alloc.free_pages, t]))
    return s


def _wired(s):
    counters, tracker = RunCounters(), RequestTracker()
    ledger = ControlLedger(lambda: counters.step)
    kv_holds = KvPressure(s, None, pipelined=False)
    observer = StepObserver(scheduler=s, counters=counters, tracker=tracker, ledger=ledger, kv_holds=kv_holds)
    ctx = ScriptContext(scheduler=s, counters=counters, ledger=ledger, poster=None, tracker=tracker, inbox=None,
                        kv_holds=kv_holds, observer=observer, weight_trainer=WeightTrainer())
    return ctx, counters, tracker, kv_holds, observer


def test_exhausted_kv_is_held_counted_and_given_back():
    s = _allocating(FakeScheduler(idle=True))
    ctx, _, _, kv_holds, observer = _wired(s)
    assert ctx.exhaust_kv(leave_pages=10) == TOTAL - 10
    assert kv_holds.holding and ctx.exhausted_kv_tokens == kv_holds.tokens == TOTAL - 10
    observer.observe_windows()
    assert observer.after_script() is None  # the pool accounting counts the held tokens as held
    kv_holds.release()
    assert not kv_holds.holding and ctx.exhausted_kv_tokens == 0
    assert len(s.token_to_kv_pool_allocator.free_pages) == TOTAL


def test_a_kv_leak_is_still_reported_when_nothing_is_held_by_the_script():
    s = _allocating(FakeScheduler(idle=True))
    _, counters, _, _, observer = _wired(s)
    s.token_to_kv_pool_allocator.alloc(10)  # taken behind the harness's back
    counters.step, counters.iteration = 3, 7
    observer.observe_windows()
    violation = observer.after_script()
    assert violation is not None and (violation.step, violation.iteration) == (3, 7)


def test_handles_read_the_shared_tracker_and_batch_log():
    s = FakeScheduler()
    ctx, counters, tracker, _, _ = _wired(s)
    handle = ReqHandle("r1", HttpAnswer(), 0, scheduler=s, tracker=tracker, counters=counters)
    assert handle.status == "posted"
    req = FakeReq("r1", row=1)
    s.waiting_queue.append(req)
    tracker.on_ingested("r1", s)
    assert handle.status == "waiting"
    counters.batch_log.append(BatchRecord(1, None, "extend", ("r1",), None))
    assert handle.chunks_done == 1 and ctx.batch_log is counters.batch_log
    s.waiting_queue.clear()
    assert handle.status == "lost"  # held nowhere, never finished
    # SGLang's own abort: retract_decode's last request that cannot fit even alone is dropped with
    # to_finish set and its abort answer sent, no finish reason (met under PP by a dev exploration)
    FINISH_ABORT = type("FINISH_ABORT", (), {})
    req.to_finish = FINISH_ABORT()
    assert handle.status == "aborted"
    req.to_finish = None
    tracker.abort_matched.add("r1")
    assert handle.status == "finished"


def test_the_context_asks_the_observer_for_checks_and_windows():
    ctx, counters, _, _, observer = _wired(FakeScheduler())
    counters.step = 5
    assert ctx.step == 5
    assert ctx.check_enabled("greedy_output") and observer.contracts_enabled
    observer.invariants.reset(["greedy_output"])
    assert not ctx.check_enabled("greedy_output")
    assert observer.dispatch_contracts is observer.invariants.memory.contracts
    observer.observe_windows()
    assert ctx.window_stats() == observer.windows.report()


class _Inbox:
    """The tokenizer inbox's inject, as the driver rank's input queue."""

    def __init__(self):
        self.frames = []

    def inject(self, raw, obj):
        self.frames.append((raw, obj))


def test_under_pp_kv_pressure_is_queued_for_every_rank_and_applied_at_dispatch():
    """Under PP the script's take, evict and release are RankKvOps in the
    driver rank's input (pickled: rank 0 relays them down the pipeline);
    nothing changes until a rank dispatches one, and each rank then leaves
    the same room free."""
    import pickle

    from scripted_runtime.scheduler_side import rank_ops

    s = _allocating(FakeScheduler(idle=True))
    inbox = _Inbox()
    kv = KvPressure(s, inbox, pipelined=True)
    assert kv.release() == 0 and not inbox.frames  # nothing held: nothing queued
    assert kv.take(leave_tokens=10) == TOTAL - 10
    assert kv.holding and kv.tokens == 0 and kv.promised_tokens == TOTAL - 10
    (raw, op), = inbox.frames
    assert pickle.loads(raw) == op and op.kind == rank_ops.TAKE and op.leave_tokens == 10

    # another rank, its own pools: applies the op it was relayed, hands everything else on
    other = _allocating(FakeScheduler(idle=True))
    other._request_dispatcher = lambda req: ("sglang", req)
    agent = rank_ops.RankAgent(other)
    assert other._request_dispatcher(pickle.loads(raw)) is None
    assert other._request_dispatcher("generate") == ("sglang", "generate")
    assert agent.holds.tokens == TOTAL - 10 and len(other.token_to_kv_pool_allocator.free_pages) == 10

    assert kv.on_dispatch(op) == TOTAL - 10  # the driver rank's own dispatch
    assert kv.tokens == kv.promised_tokens == TOTAL - 10 and len(s.token_to_kv_pool_allocator.free_pages) == 10

    assert kv.release() == TOTAL - 10 and kv.promised_tokens == 0 and kv.holding  # queued, still held
    release = inbox.frames[-1][1]
    assert kv.on_dispatch(release) == TOTAL - 10 and not kv.holding
    other._request_dispatcher(pickle.loads(inbox.frames[-1][0]))
    assert agent.holds.tokens == 0 and len(other.token_to_kv_pool_allocator.free_pages) == TOTAL


def test_under_pp_a_take_queued_then_released_in_the_same_step_holds_nothing_after():
    s = _allocating(FakeScheduler(idle=True))
    inbox = _Inbox()
    kv = KvPressure(s, inbox, pipelined=True)
    kv.take(leave_tokens=0)
    assert kv.release() == TOTAL and kv.promised_tokens == 0  # the reset's give-back sees the queued take
    for _, op in inbox.frames:
        kv.on_dispatch(op)
    assert not kv.holding and len(s.token_to_kv_pool_allocator.free_pages) == TOTAL


def test_another_rank_restarts_the_schedule_policy_counters_at_the_reset_flush_only():
    """Every rank counts its own prefill passes (SGLang's schedule policy);
    the driver's reset restarts its own at the reset's flush, and every other
    rank must do the same at the same frame, or the ranks' trees would split
    nodes at different passes (sglang_compat.POLICY_CALL_COUNTERS)."""
    import pytest

    pytest.importorskip("sglang")
    from types import SimpleNamespace

    from scripted_runtime.hooks import sglang_compat
    from scripted_runtime.scheduler_side import rank_ops

    other = FakeScheduler(idle=True)
    other.policy = SimpleNamespace(_waiting_prefix_refresh_calls=37, _shortest_prefill_calls=5)
    other._request_dispatcher = lambda req: ("sglang", type(req).__name__)
    rank_ops.RankAgent(other)
    plain_flush = type(sglang_compat.reset_flush_frame()[1])()
    assert other._request_dispatcher(plain_flush) == ("sglang", "FlushCacheReqInput")
    assert sglang_compat.policy_call_counters(other) == (("_waiting_prefix_refresh_calls", 37),
                                                        ("_shortest_prefill_calls", 5))
    other._request_dispatcher(sglang_compat.reset_flush_frame()[1])
    assert sglang_compat.policy_call_counters(other) == (("_waiting_prefix_refresh_calls", 0),
                                                        ("_shortest_prefill_calls", 0))
    assert sglang_compat.policy_call_counters(SimpleNamespace(policy=SimpleNamespace())) is None
