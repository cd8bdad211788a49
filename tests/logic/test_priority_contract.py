"""The ``priority`` contract (docs/checks.md, "The priority contract") on
fakes: each prefill's record as the driver takes it (the launched requests'
and the waiting queue's priority, queue entry time and retracted flag, and
when the iteration's intake ended). A real server: tests/server/test_priority.py."""
from __future__ import annotations

import pytest

from scripted_runtime.scheduler_side.invariants import InvariantChecker, StateView
from scripted_runtime.scheduler_side.run_counters import BatchRecord
from tests.fakes import FakeReq, FakeScheduler

INTAKE = 100.0  # the iteration's requests were taken in by then (Driver.after_ingest)


class Run:
    def __init__(self, *, preemption=True, low_first=False):
        self.reqs = {rid: FakeReq(rid, row=i + 1, allocated=4) for i, rid in enumerate("abcdef")}
        self.s = FakeScheduler(reqs=list(self.reqs.values()))
        self.s.enable_priority_scheduling = True
        self.s.enable_priority_preemption = preemption
        self.s.schedule_low_priority_values_first = low_first
        self.s.priority_scheduling_preemption_threshold = 10
        # the per-iteration invariants off (they judge the fakes' pools); every contract on
        self.checker = InvariantChecker(["idle_gate", "slot_ownership", "radix_locks", "pool_accounting"])
        self.log = []

    def prefill(self, admitted, waiting, chunked=None):
        """``admitted``/``waiting``: (rid, priority, entry time, retracted)."""
        self.log.append(BatchRecord(len(self.log), None, "extend", tuple(e[0] for e in admitted), chunked,
                                    priority_pass=(tuple(admitted), tuple(waiting), INTAKE)))

    def check(self):
        return self.checker.check(StateView(self.s), step=len(self.log), batch_log=self.log, tracked={})


def test_admission_in_priority_then_entry_order_passes():
    run = Run()
    run.prefill([("a", 20, 1.0, False), ("b", 5, 0.5, False)], [("c", 5, 2.0, False), ("d", 0, 0.1, False)])
    assert run.check() is None


def test_a_better_request_left_waiting_is_a_violation_naming_both():
    run = Run()
    run.prefill([("a", 0, 1.0, False)], [("b", 5, 2.0, False)])
    v = run.check()
    assert v is not None and v.name == "priority"
    assert "admitted a (priority 0)" in v.message and "b (priority 5, queued later) stays waiting" in v.message


def test_equal_priority_goes_by_queue_entry_and_low_values_first_flips_the_order():
    run = Run()
    run.prefill([("a", 5, 2.0, False)], [("b", 5, 1.0, False)])  # b queued first: it goes first
    assert run.check() is not None
    low = Run(low_first=True)
    low.prefill([("a", 0, 1.0, False)], [("b", 5, 0.5, False)])  # 0 is the better one there
    assert low.check() is None


def test_the_continuing_chunk_goes_first_whatever_its_priority():
    run = Run()
    run.prefill([("a", 0, 1.0, False)], [("b", 5, 2.0, False)], chunked="a")  # a starts chunking
    assert run.check() is not None  # the first chunk was admitted past a better one: a violation
    ok = Run()
    ok.prefill([("a", 20, 1.0, False)], [("b", 5, 2.0, False)], chunked="a")
    assert ok.check() is None
    ok.prefill([("a", 20, 1.0, False), ("c", 5, 0.5, False)], [("b", 5, 2.0, False)])
    assert ok.check() is None  # a continues, c admitted before b (queued earlier): in order


def test_a_victim_needs_a_preemptor_better_by_more_than_the_threshold():
    run = Run()
    run.reqs["a"].kv.req_pool_idx = None  # released, as preemption does
    run.prefill([("u", 20, 1.0, False)], [("a", 0, INTAKE + 1, True)])
    assert run.check() is None  # 20 - 0 > 10
    close = Run()
    close.reqs["a"].kv.req_pool_idx = None
    close.prefill([("u", 5, 1.0, False)], [("a", 0, INTAKE + 1, True)])
    v = close.check()
    assert v is not None and "a (priority 0) was preempted" in v.message and "threshold 10" in v.message


def test_a_victim_holding_its_row_or_in_the_prefill_is_a_violation():
    run = Run()
    run.prefill([("u", 20, 1.0, False)], [("a", 0, INTAKE + 1, True)])  # a still holds row 1
    v = run.check()
    assert v is not None and "still holds req_to_token row 1" in v.message


def test_no_victim_while_preemption_is_off_and_a_retract_before_the_intake_is_none():
    run = Run(preemption=False)
    run.reqs["a"].kv.req_pool_idx = None
    run.prefill([("u", 20, 1.0, False)], [("a", 0, INTAKE + 1, True)])
    v = run.check()
    assert v is not None and "priority preemption is off" in v.message
    paused = Run()
    paused.prefill([("u", 0, 1.0, False)], [("a", 0, INTAKE - 1, True)])  # retracted by a pause, queued earlier
    assert paused.check() is None  # waiting, in order; no victim of this pass


def test_nothing_is_judged_without_priority_scheduling():
    run = Run()
    run.s.enable_priority_scheduling = False
    run.prefill([("a", 0, 1.0, False)], [("b", 5, 2.0, False)])
    assert run.check() is None
