"""The abstract state of a scheduler iteration
(``scheduler_side/abstract_state.py``) on a stand-in scheduler: its buckets,
each field, the control operations with their phase, the key it travels as,
the step observer's switch. No SGLang process (its cost per iteration:
bench/abstract_state_cost.py)."""
from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import pytest

from scripted_runtime.scheduler_side import abstract_state as AS
from scripted_runtime.scheduler_side.control import ControlLedger, ControlOp
from scripted_runtime.scheduler_side.http_poster import HttpAnswer
from scripted_runtime.scheduler_side.rank_ops import KvPressure
from scripted_runtime.scheduler_side.request_tracker import RequestTracker
from scripted_runtime.scheduler_side.run_counters import RunCounters
from scripted_runtime.scheduler_side.step_observer import StepObserver
from tests.fakes import FakeBatch, FakeReq, FakeScheduler, busy_scheduler


def test_buckets_tell_none_one_a_few_and_a_crowd_apart():
    assert [AS.count_bucket(n) for n in (0, 1, 2, 3, 4, 50)] == [0, 1, 2, 2, 3, 3]
    assert [AS.occupancy_bucket(u, 100) for u in (0, 1, 25, 26, 50, 75, 76, 100)] == [0, 1, 1, 2, 2, 3, 4, 4]
    assert AS.occupancy_bucket(5, 0) == 0  # a pool that reports no size
    assert [AS.tree_bucket(t) for t in (0, 1, 64, 65, 256, 257)] == [0, 1, 1, 2, 2, 3]


def test_an_idle_engine_is_all_zeros():
    assert AS.counts_of(FakeScheduler(idle=True)) == (0,) * len(AS.FIELDS)


def test_every_field_reads_its_part_of_the_state():
    a, b = FakeReq("a", row=1, allocated=30), FakeReq("b", row=2, allocated=30, done=True)
    s = FakeScheduler(reqs=[a, b], evictable=20, protected=10)  # 60 + 30 of 100 KV used: the fourth quarter
    s.waiting_queue = [FakeReq(f"w{i}") for i in range(5)]
    s.chunked_req = FakeReq("c", row=3)
    s.result_queue = deque([(FakeBatch([a]), None)])
    s.mbs = [None, FakeBatch([a], mode="extend"), FakeBatch([])]  # an empty slot is not in flight
    s._engine_paused = True
    counts = dict(zip(AS.FIELDS, AS.counts_of(s)))
    assert counts == {"w": 3, "r": 2, "d": 1, "c": 1, "p": 1, "f": 2, "k": 4, "t": 1}


def test_a_tuple_sized_tree_and_a_failing_stat_do_not_fail_the_scan():
    s = FakeScheduler(idle=True)
    s.tree_cache = SimpleNamespace(evictable_size=lambda: (70, 3), protected_size=lambda: 1 / 0)
    assert dict(zip(AS.FIELDS, AS.counts_of(s)))["t"] == 2


def test_phase_is_read_off_the_state_before_by_precedence():
    def counts(**fields):
        return tuple(fields.get(f, 0) for f in AS.FIELDS)

    assert AS.phase_of(None) == "idle" and AS.phase_of(counts()) == "idle"
    assert AS.phase_of(counts(w=1)) == "queued"
    assert AS.phase_of(counts(w=1, r=1)) == "decode"
    assert AS.phase_of(counts(r=1, d=1)) == "finished_unpruned"
    assert AS.phase_of(counts(r=1, f=1)) == "in_flight"
    assert AS.phase_of(counts(r=1, f=1, c=1)) == "prefill"
    assert AS.phase_of(counts(c=1, p=1)) == "paused"


def test_operations_are_named_short_and_a_refusal_is_marked():
    refused = SimpleNamespace(success=False)
    assert AS.op_label("abort(r0-12-3)", None) == "abort"
    assert AS.op_label("pause_generation(retract)", None) == "pause(retract)"
    assert AS.op_label("continue_generation", None) == "continue"
    assert AS.op_label("update_weights_from_disk", refused) == "update_weights:refused"
    assert AS.op_label("flush_cache", SimpleNamespace(success=True)) == "flush_cache"


def test_a_state_key_is_compact_and_parses_back():
    state = (1, 2, 0, 1, 0, 3, 4, 2, (("flush_cache:refused", "prefill"), ("abort", "prefill")))
    key = AS.key_of(state)
    assert key == "w1r2d0c1p0f3k4t2+flush_cache:refused@prefill+abort@prefill"
    parsed = AS.parse_key(key)
    assert [parsed[f] for f in AS.FIELDS] == list(state[:8])
    assert parsed["ops"] == [("flush_cache:refused", "prefill"), ("abort", "prefill")]
    assert AS.parse_key("w0r0d0c0p0f0k0t0")["ops"] == []


def _observer(s):
    """A step observer wired as the driver wires it, with the ledger it reads."""
    counters = RunCounters()
    ledger = ControlLedger(lambda: counters.step)
    observer = StepObserver(scheduler=s, counters=counters, tracker=RequestTracker(), ledger=ledger,
                            kv_holds=KvPressure(s, None, pipelined=False))
    return observer, counters, ledger


def _flush_processed_at(ledger, step, success):
    op = ledger.register(ControlOp(name="flush_cache", request_type="FlushCacheReqInput", rid=None,
                                   posted_step=step - 1, http=HttpAnswer()))
    op.processed_step, op.answer = step, SimpleNamespace(success=success)


def test_the_observer_records_states_only_when_switched_on(monkeypatch):
    s = FakeScheduler(idle=True)
    observer, _, _ = _observer(s)
    scans = []
    real = AS.counts_of
    monkeypatch.setattr(AS, "counts_of", lambda sched: scans.append(1) or real(sched))
    observer.abstract.begin(False)  # the default: a script not run with RunScript.abstract_states
    observer.observe_windows()
    observer.after_script()
    assert scans == [] and observer.abstract_states() == ()
    observer.abstract.begin(True)
    observer.observe_windows()
    observer.after_script()
    assert scans == [1] and observer.abstract_states() == ("w0r0d0c0p0f0k0t0",)


def test_an_operation_is_recorded_with_the_phase_of_the_state_it_was_processed_against():
    s = FakeScheduler(idle=True)
    observer, counters, ledger = _observer(s)
    observer.abstract.begin(True)
    s.waiting_queue = [FakeReq("a")]
    observer.observe_windows()
    observer.after_script()  # step 0 leaves a request queued
    _flush_processed_at(ledger, 1, success=False)  # step 1 processes a flush against it, and refuses it
    s.waiting_queue = []
    counters.step = 1
    observer.observe_windows()
    observer.after_script()
    counters.step = 2  # the flush is not this iteration's any more
    observer.observe_windows()
    observer.after_script()
    assert observer.abstract_states() == ("w0r0d0c0p0f0k0t0", "w0r0d0c0p0f0k0t0+flush_cache:refused@queued",
                                          "w1r0d0c0p0f0k0t0")


def test_a_busy_engine_in_every_place_reads_as_one_key():
    """The busy stand-in ``bench/abstract_state_cost.py`` times (what it
    costs is that bench's question, not a test's): four running, two
    waiting, a chunk between chunks, two of six PP slots holding a batch."""
    states = AS.AbstractStates()
    states.begin(True)
    states.observe(busy_scheduler(), ())
    assert states.keys() == ("w2r3d0c1p0f2k3t1",)


@pytest.mark.parametrize("enabled", [False, True])
def test_begin_forgets_the_previous_script(enabled):
    states = AS.AbstractStates()
    states.begin(True)
    states.observe(FakeScheduler(idle=True))
    states.begin(enabled)
    assert states.keys() == () and states.enabled is enabled
