"""The runtime-knob and weight-query contracts (``runtime_limits``,
``weight_queries``) on small fakes (pure logic; against the real scheduler:
tests/server/test_runtime_ops.py, and the mutants in test_mutants.py)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from scripted_runtime.hooks import sglang_compat
from scripted_runtime.scheduler_side import runtime_contracts
from scripted_runtime.scheduler_side.run_counters import BatchRecord
from scripted_runtime.scheduler_side.invariants import InvariantChecker, StateView
from tests.fakes import FakeReq, FakeScheduler
from tests.logic.test_contracts import req_input


class Run:
    def __init__(self, s, limit):
        self.s = s
        self.checker = InvariantChecker(["idle_gate", "slot_ownership", "radix_locks", "pool_accounting"])
        self.checker.memory.runtime.served_limit = limit
        self.log = []
        self.step = 0

    @property
    def mem(self):
        return self.checker.memory.runtime

    def prefill(self, rids, running, chunked=None):
        self.log.append(BatchRecord(self.step, None, "extend", tuple(rids), chunked, running=running))

    def check(self):
        v = self.checker.check(StateView(self.s), step=self.step, batch_log=self.log, tracked={})
        self.step += 1
        return v


@pytest.fixture
def run():
    reqs = [FakeReq(rid, row=i + 1, allocated=4) for i, rid in enumerate("abcde")]
    return Run(FakeScheduler(reqs=reqs), limit=2)


def test_a_prefill_within_the_limit_passes(run):
    run.prefill("ab", running=0)
    assert run.check() is None
    run.prefill("c", running=1)
    assert run.check() is None


def test_a_prefill_past_the_limit_is_a_violation_naming_the_counts(run):
    run.prefill("abc", running=0)
    v = run.check()
    assert v is not None and v.name == "runtime_limits"
    assert "holds 3 requests" in v.message and "limit 2 admits at most 2" in v.message


def test_nothing_new_is_admitted_once_the_running_batch_is_full(run):
    run.prefill("c", running=2)
    v = run.check()
    assert v is not None and "admits at most 0" in v.message


def test_the_continuing_chunk_is_let_through_even_when_full(run):
    run.prefill("a", running=0, chunked="a")  # a's first chunk
    assert run.check() is None
    run.prefill("a", running=3, chunked="a")  # its next chunk, the running batch over the limit (set lower)
    assert run.check() is None
    run.prefill("ab", running=3)  # its last chunk, but nothing beside it
    v = run.check()
    assert v is not None and "continuing chunk" in v.message


def _set(limit):
    return req_input("SetInternalStateReq", server_args={sglang_compat.MICRO_BATCH_KNOB: limit})


def test_set_internal_state_must_answer_by_sglang_s_range(run, monkeypatch):
    value = {"limit": 8}
    monkeypatch.setattr(sglang_compat, "micro_batch_limit", lambda s: value["limit"])
    monkeypatch.setattr(sglang_compat, "micro_batch_limit_range", lambda s: (1, 8))
    mem = run.mem
    for limit, updated, applied in ((3, True, 3), (0, False, 3), (9, False, 3), (8, True, 8)):
        before = mem.before_dispatch(run.s, _set(limit))
        value["limit"] = applied
        mem.on_dispatch(run.s, _set(limit), SimpleNamespace(updated=updated), 0, before)
    assert mem.problems == [] and mem.served_limit == 8
    # accepted but not applied; refused but applied; refused though valid
    for limit, updated, applied in ((4, True, 8), (0, False, 0), (5, False, 8)):
        value["limit"] = 8
        before = mem.before_dispatch(run.s, _set(limit))
        value["limit"] = applied
        mem.on_dispatch(run.s, _set(limit), SimpleNamespace(updated=updated), 0, before)
    messages = [m for _, m in mem.problems]
    assert len(messages) == 3
    assert "accepted, yet admission reads 8" in messages[0]
    assert "refused, yet the limit moved from 8 to 0" in messages[1]
    assert "updated=False, though the value is within" in messages[2]


def test_slow_down_must_set_or_clear_the_sleep(run):
    mem = run.mem
    run.s.forward_sleep_time = 0.5
    mem.on_dispatch(run.s, req_input("SlowDownReqInput", forward_sleep_time=0.5), None, 0, {})
    run.s.forward_sleep_time = None
    mem.on_dispatch(run.s, req_input("SlowDownReqInput", forward_sleep_time=0), None, 0, {})
    assert mem.problems == []
    run.s.forward_sleep_time = 0.5
    mem.on_dispatch(run.s, req_input("SlowDownReqInput", forward_sleep_time=-1), None, 0, {})
    assert mem.problems and "left forward_sleep_time at 0.5" in mem.problems[0][1]


def _checksum(digest_holder, checksum, run, monkeypatch):
    monkeypatch.setattr(runtime_contracts, "weights_digest", lambda s: digest_holder["d"])
    monkeypatch.setattr(sglang_compat, "weight_checker_snapshot", lambda s: None)
    req = req_input("CheckWeightsReqInput", action="checksum")
    before = run.mem.before_dispatch(run.s, req)
    answer = SimpleNamespace(success=True, payload=[SimpleNamespace(per_gpu_checksum=checksum)])
    run.mem.on_dispatch(run.s, req, answer, 0, before)


def test_checksums_must_follow_the_weights_both_ways(run, monkeypatch):
    digest = {"d": "w1"}
    _checksum(digest, "c1", run, monkeypatch)
    _checksum(digest, "c1", run, monkeypatch)
    digest["d"] = "w2"
    _checksum(digest, "c2", run, monkeypatch)
    assert run.mem.problems == []
    _checksum(digest, "c3", run, monkeypatch)  # same weights, another checksum
    digest["d"] = "w3"
    _checksum(digest, "c1", run, monkeypatch)  # other weights, an earlier checksum
    assert [m for _, m in run.mem.problems] == [
        "check_weights(checksum) answered another checksum for weights that did not change",
        "check_weights(checksum) answered the same checksum for different weights"]


def test_a_query_that_changes_the_pools_is_a_violation(run):
    req = req_input("GetInternalStateReq")
    before = run.mem.before_dispatch(run.s, req)
    run.s.req_to_token_pool.free_slots.pop()
    run.mem.on_dispatch(run.s, req, SimpleNamespace(), 0, before)
    assert run.mem.problems and "the query GetInternalStateReq changed the pools: rows_free" in run.mem.problems[0][1]


def test_sessions_open_exactly_new_ids_and_close_at_once_when_idle(run, monkeypatch):
    open_now = {"ids": ()}
    monkeypatch.setattr(sglang_compat, "open_sessions", lambda s: open_now["ids"])
    monkeypatch.setattr(sglang_compat, "session_closing", lambda s, sid: False)
    monkeypatch.setattr(sglang_compat, "session_has_unfinished_request", lambda s, sid: False)
    mem = run.mem

    def dispatch(kind, sid, success, after):
        req = req_input(kind, session_id=sid)
        before = mem.before_dispatch(run.s, req)
        open_now["ids"] = after
        mem.on_dispatch(run.s, req, None if success is None else SimpleNamespace(success=success), 0, before)

    dispatch("OpenSessionReqInput", "a", True, ("a",))
    dispatch("OpenSessionReqInput", "a", False, ("a",))  # open already: refused
    dispatch("CloseSessionReqInput", "a", None, ())
    assert mem.problems == []
    dispatch("OpenSessionReqInput", "b", False, ())  # a new id refused
    dispatch("OpenSessionReqInput", "b", True, ("b",))
    dispatch("OpenSessionReqInput", "b", True, ("b",))  # an open id accepted again
    dispatch("CloseSessionReqInput", "b", None, ("b",))  # left open, not marked to close
    assert [m.split(",")[0] for _, m in mem.problems] == [
        "open_session('b') answered success=False", "open_session('b') answered success=True",
        "close_session('b') left the session open"]


def test_diagnostics_a_profile_past_its_target_and_a_log_level_not_applied_are_violations(tmp_path):
    s = SimpleNamespace(forward_ct=10, profiler_manager=SimpleNamespace(
        profile_in_progress=True, profiler_target_forward_ct=8, torch_profiler_output_dir=str(tmp_path)))
    mem = runtime_contracts.RuntimeMemory()
    assert runtime_contracts.check_profile_stopped(s, mem) is None, "no num_steps: runs until stopped"
    # started at forward 5 with num_steps=2: it must have stopped at forward 8 (SGLang's target, computed
    # from the request, not read from SGLang)
    start = type("ProfileReq", (SimpleNamespace,), {})(req_type=SimpleNamespace(name="START_PROFILE"), num_steps=2,
                                                       start_step=None)
    mem._on_diagnostic(s, start, SimpleNamespace(success=True), {"profile": {"in_progress": False, "forward_ct": 5,
                                                                             "output_dir": str(tmp_path)},
                                                                 "traces": []})
    assert mem.profile_stop_at == 8 and not mem.problems
    s.forward_ct = 7
    assert runtime_contracts.check_profile_stopped(s, mem) is None, "short of its target: still running"
    # run_batch counts the batch, then its profile predicate stops the profile at the target: no slack
    s.forward_ct = 8
    assert "should have stopped at forward 8" in runtime_contracts.check_profile_stopped(s, mem)
    # configure_logging: the level it asked for, in the scheduler's root logger
    import logging

    req = type("ConfigureLoggingReq", (SimpleNamespace,), {})(log_level="error")
    before = mem.before_dispatch(s, req) if hasattr(s, "tree_cache") else {"pools": None}
    root = logging.getLogger()
    old = root.level
    try:
        root.setLevel("ERROR")
        mem._on_diagnostic(s, req, None, before)
        assert not mem.problems
        root.setLevel("INFO")
        mem._on_diagnostic(s, req, None, before)
        assert mem.problems and "left the scheduler's log level at INFO" in mem.problems[0][1]
    finally:
        root.setLevel(old)
    # a stop that answered success but wrote no trace
    mem.problems.clear()
    stop = type("ProfileReq", (SimpleNamespace,), {})(req_type=SimpleNamespace(name="STOP_PROFILE"))
    s.profiler_manager.profile_in_progress = False
    mem._on_diagnostic(s, stop, SimpleNamespace(success=True), {"profile": {"in_progress": True,
                                                                            "output_dir": str(tmp_path)},
                                                                "traces": []})
    assert mem.problems and "wrote no trace" in mem.problems[0][1]
    mem.problems.clear()
    (tmp_path / "x.trace.json.gz").write_text("{}")
    mem._on_diagnostic(s, stop, SimpleNamespace(success=True), {"profile": {"in_progress": True,
                                                                            "output_dir": str(tmp_path)},
                                                                "traces": []})
    assert not mem.problems


def test_a_priority_preemption_frees_a_slot_for_the_request_it_admits(run):
    # the limit lowered to 2 below 3 running; a better request preempts one and is admitted: one for
    # one (found by the pp1-priority exploration: SGLang takes victims by tokens, not slots)
    victim = ("c", 0, 101.0, True)
    run.log.append(BatchRecord(run.step, None, "extend", ("d",), None, running=2,
                               priority_pass=((("d", 20, 100.5, False),), (victim,), 100.0)))
    assert run.check() is None
    run.log.append(BatchRecord(run.step, None, "extend", ("e",), None, running=2,
                               priority_pass=((("e", 20, 102.5, False),), (), 102.0)))  # no victim: over
    v = run.check()
    assert v is not None and v.name == "runtime_limits"


def test_diagnostics_a_start_over_an_overdue_num_steps_profile_names_the_overdue_profile(tmp_path):
    """A second start_profile while a num_steps profile runs past its target:
    the fault is the profile that should have stopped (SGLang stops it at
    the batch that reaches its target), named as such, not as the
    registered accepted-second-start bug; a second start within the target
    is that registered bug's message."""
    s = SimpleNamespace(forward_ct=5, profiler_manager=SimpleNamespace(
        profile_in_progress=False, profiler_target_forward_ct=None, torch_profiler_output_dir=str(tmp_path)))
    start = type("ProfileReq", (SimpleNamespace,), {})(req_type=SimpleNamespace(name="START_PROFILE"), num_steps=2,
                                                       start_step=None)
    running = lambda ct: {"profile": {"in_progress": True, "forward_ct": ct, "output_dir": str(tmp_path)},
                          "traces": []}
    s.profiler_manager.profile_in_progress = True
    mem = runtime_contracts.RuntimeMemory()
    mem._on_diagnostic(s, start, SimpleNamespace(success=True), {
        "profile": {"in_progress": False, "forward_ct": 5, "output_dir": str(tmp_path)}, "traces": []})
    assert mem.profile_stop_at == 8 and not mem.problems
    mem._on_diagnostic(s, start, SimpleNamespace(success=True), running(8))
    assert len(mem.problems) == 1 and "should have stopped at forward 8" in mem.problems[0][1]
    assert "while a profile was running" not in mem.problems[0][1]
    mem = runtime_contracts.RuntimeMemory()
    mem._on_diagnostic(s, start, SimpleNamespace(success=True), {
        "profile": {"in_progress": False, "forward_ct": 5, "output_dir": str(tmp_path)}, "traces": []})
    mem._on_diagnostic(s, start, SimpleNamespace(success=True), running(7))
    assert [m for _, m in mem.problems] == [
        "start_profile answered success while a profile was running (SGLang refuses that)"]
