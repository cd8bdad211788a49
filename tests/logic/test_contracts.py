"""The control-operation contracts on small fakes (pure logic; against the
real scheduler: the pause contract killing a mutant in test_mutants.py, the PP
pause bug in test_explore.py)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from scripted_runtime.scheduler_side import contracts
from scripted_runtime.scheduler_side.run_counters import BatchRecord
from scripted_runtime.scheduler_side.invariants import InvariantChecker, StateView
from tests.fakes import FakeReq, FakeScheduler


class Run:
    """One run's checker, batch log and step counter over a fake scheduler."""

    def __init__(self, s, disabled=(), loop="normal"):
        self.s = s
        s.enable_overlap = loop == "overlap"
        self.checker = InvariantChecker(["idle_gate", "slot_ownership", "radix_locks", "pool_accounting",
                                         *disabled])
        self.log = []
        self.step = 0
        self.tracked = {}

    @property
    def mem(self):
        return self.checker.memory.contracts

    def dispatch(self, recv_req, output=None):
        before = self.mem.before_dispatch(self.s, recv_req)
        self.mem.on_dispatch(self.s, recv_req, output, self.step, before)

    def launch(self, *reqs, mode="decode"):
        self.log.append(BatchRecord(self.step, None, mode, tuple(r.rid for r in reqs), None))

    def check(self):
        v = self.checker.check(StateView(self.s), step=self.step, batch_log=self.log, tracked=self.tracked)
        self.step += 1
        return v


def req_input(name, **fields):
    return type(name, (), fields)()


PAUSE_IN_PLACE = req_input("PauseGenerationReqInput", mode="in_place")
PAUSE_RETRACT = req_input("PauseGenerationReqInput", mode="retract")
CONTINUE = req_input("ContinueGenerationReqInput")


def abort(rid="", everything=False):
    return req_input("AbortReq", rid=rid, abort_all=everything)


def test_pause_quiet_when_nothing_moves_and_after_continue():
    a = FakeReq("a", row=1, allocated=10)
    run = Run(FakeScheduler(reqs=[a]))
    run.dispatch(PAUSE_IN_PLACE)
    for _ in range(4):
        assert run.check() is None
    run.dispatch(CONTINUE)
    run.launch(a)
    a.output_ids.append(7)
    assert run.check() is None


def test_pause_a_forward_launched_while_paused_is_a_contract_violation():
    a = FakeReq("a", row=1, allocated=10)
    run = Run(FakeScheduler(reqs=[a]))
    run.step = 5
    run.dispatch(PAUSE_IN_PLACE)
    run.launch(a)  # the PP loop of 0.5.23 does this
    v = run.check()
    assert v is not None and v.invariant == "pause" and v.kind == "ContractViolation"
    assert "launched at step 5, while paused (in_place) since step 5" in v.message
    assert v.owners["a"]["row"] == 1


def test_pause_output_tokens_gained_while_paused():
    a = FakeReq("a", row=1, allocated=10)
    run = Run(FakeScheduler(reqs=[a]))
    run.dispatch(PAUSE_RETRACT)  # a is left in running_batch: caught first
    assert run.check().message.startswith("pause_generation(retract) left live requests")
    run = Run(FakeScheduler(reqs=[a]))
    run.dispatch(PAUSE_IN_PLACE)
    assert run.check() is None  # the baseline: what a handler committed counts as before
    a.output_ids.append(3)
    v = run.check()
    assert v.invariant == "pause" and "went from 0 to 1 output tokens while paused" in v.message


def test_pause_retract_that_empties_the_batches_is_quiet():
    s = FakeScheduler(reqs=[])
    waiting = FakeReq("w", row=None)
    s.waiting_queue = [waiting]
    run = Run(s)
    run.dispatch(PAUSE_RETRACT)
    assert run.check() is None and run.check() is None


def test_continue_must_move_live_work_within_its_bound():
    a = FakeReq("a", row=1, allocated=10)
    run = Run(FakeScheduler(reqs=[a]))
    run.dispatch(CONTINUE)
    results = [run.check() for _ in range(contracts.CONTINUE_ITERATIONS + 1)]
    assert results[:-1] == [None] * contracts.CONTINUE_ITERATIONS
    assert results[-1].invariant == "continue" and "no forward was launched" in results[-1].message
    run = Run(FakeScheduler(reqs=[a]))
    run.dispatch(CONTINUE)
    run.launch(a)
    assert all(run.check() is None for _ in range(8))


def test_abort_a_request_decoding_on_after_its_abort():
    a = FakeReq("a1", row=1, allocated=10)
    run = Run(FakeScheduler(reqs=[a]))
    run.dispatch(abort("a"))  # a prefix, as SGLang matches
    run.launch(a)  # the decode of the abort's own iteration: it applies to_finish
    assert run.check() is None
    b = FakeReq("b", row=2, allocated=10)
    for _ in range(6):  # prefills of others may go first: iterations are not the measure
        run.launch(b, mode="extend")
        assert run.check() is None
    run.launch(a)
    v = run.check()
    assert v.invariant == "abort" and "took part in 2 decode forwards after its abort" in v.message


def test_abort_a_request_never_finished_within_the_cap():
    a = FakeReq("a", row=1, allocated=10)
    run = Run(FakeScheduler(reqs=[a]))
    run.dispatch(abort("a"))
    assert all(run.check() is None for _ in range(contracts.ABORT_ITERATION_CAP))
    v = run.check()
    assert v.invariant == "abort" and f"still live {contracts.ABORT_ITERATION_CAP + 1} iterations" in v.message


def test_abort_only_a_waiting_request_may_vanish_without_a_finish_reason():
    s = FakeScheduler(reqs=[])
    w = FakeReq("w")
    s.waiting_queue = [w]
    run = Run(s)
    run.dispatch(abort("w"))
    s.waiting_queue = []  # SGLang drops it, no finish reason
    assert run.check() is None and not run.mem.aborts
    a = FakeReq("a", row=1, allocated=10)
    s = FakeScheduler(reqs=[a])
    run = Run(s)
    run.dispatch(abort("a"))
    s.running_batch.reqs = []
    a.kv.req_pool_idx = None  # released, but never finished
    v = run.check()
    assert v.invariant == "abort" and "vanished from the scheduler without a finish reason" in v.message


def test_abort_while_paused_waits_for_continue():
    a = FakeReq("a", row=1, allocated=10)
    run = Run(FakeScheduler(reqs=[a]), disabled=["pause"])
    run.dispatch(PAUSE_IN_PLACE)
    run.dispatch(abort("a"))
    assert all(run.check() is None for _ in range(10)), "the abort clock stops while paused"


def test_abort_finished_request_launched_again():
    a = FakeReq("a", row=1, allocated=10)
    run = Run(FakeScheduler(reqs=[a]))
    run.dispatch(abort(everything=True))
    a.done = True
    assert run.check() is None
    run.launch(a)
    v = run.check()
    assert v.invariant == "abort" and "was launched again" in v.message


def test_abort_request_held_nowhere_must_not_keep_its_row():
    a = FakeReq("a", row=1, allocated=10)
    s = FakeScheduler(reqs=[a])
    run = Run(s)
    run.dispatch(abort("a"))
    a.done = True
    s.running_batch.reqs = []  # released, but its row never went back to free_slots
    v = run.check()
    assert v.invariant == "abort" and "still holds req_to_token row 1" in v.message
    a.kv.req_pool_idx = None
    run = Run(s)
    run.dispatch(abort("a"))
    assert run.check() is None and not run.mem.aborts


def _flush_output(success):
    return SimpleNamespace(success=success)


def test_flush_accepted_must_leave_empty_pools():
    s = FakeScheduler(reqs=[], evictable=10)
    run = Run(s)
    run.dispatch(req_input("FlushCacheReqInput"), _flush_output(True))  # nothing was reset
    v = run.check()
    assert v.invariant == "flush" and "10 tokens still in the tree" in v.message


def test_flush_refused_must_change_nothing():
    a = FakeReq("a", row=1, allocated=10)
    s = FakeScheduler(reqs=[a])
    run = Run(s)
    flush = req_input("FlushCacheReqInput")
    before = run.mem.before_dispatch(s, flush)
    s.req_to_token_pool.free_slots.append(1)  # the refused flush freed a row anyway
    run.mem.on_dispatch(s, flush, _flush_output(False), 0, before)
    v = run.check()
    assert v.invariant == "flush" and "refused, yet the pools changed: rows_free 7 -> 8" in v.message


def test_update_weights_with_flush_is_held_to_the_flush_contract():
    s = FakeScheduler(reqs=[], evictable=4)
    run = Run(s)
    run.dispatch(req_input("UpdateWeightFromDiskReqInput", flush_cache=True), _flush_output(True))
    v = run.check()
    assert v.invariant == "update_weights"
    run = Run(s)
    run.dispatch(req_input("UpdateWeightFromDiskReqInput", flush_cache=False), _flush_output(True))
    assert run.check() is None, "without flush_cache the pools may hold anything"


@pytest.mark.parametrize("name", contracts.NAMES)
def test_each_contract_can_be_switched_off(name):
    a = FakeReq("a", row=1, allocated=10)
    s = FakeScheduler(reqs=[a], evictable=0)
    run = Run(s, disabled=[name])
    if name == "pause":
        run.dispatch(PAUSE_IN_PLACE)
        run.launch(a)
    elif name == "continue":
        run.dispatch(CONTINUE)
    elif name == "abort":
        run.dispatch(abort("a"))
    elif name == "memory_occupation":
        s.tree_cache._evictable = 5
        run.dispatch(req_input("ReleaseMemoryOccupationReqInput", tags=["kv_cache"]))  # tags not recorded either
        s.offload_tags = {"kv_cache"}
        run.launch(a)
    else:
        s.tree_cache._evictable = 5
        op = (req_input("FlushCacheReqInput") if name == "flush"
              else req_input("UpdateWeightFromDiskReqInput", flush_cache=True))
        run.dispatch(op, _flush_output(True))
    assert all(run.check() is None for _ in range(12))


def test_flush_accepted_while_a_live_request_holds_kv():
    a = FakeReq("a", row=1, allocated=10)
    s = FakeScheduler(reqs=[a])
    run = Run(s)
    flush = req_input("UpdateWeightFromDiskReqInput", flush_cache=True)
    before = run.mem.before_dispatch(s, flush)
    s.running_batch.reqs = []  # reset under it, as a flush without the idle test does
    s.req_to_token_pool.free_slots = list(range(1, 9))
    run.mem.on_dispatch(s, flush, _flush_output(True), 0, before)
    v = run.check()
    assert v.invariant == "update_weights" and "accepted while live requests held KV: a" in v.message


def test_abort_a_running_request_retracted_then_aborted_again_while_waiting_may_be_dropped():
    """abort_all, pause(retract), abort(rid) in one iteration: the first abort
    marks the running request, the retract puts it back in the waiting queue,
    the second abort drops it there without a finish reason (explorer find)."""
    a = FakeReq("a", row=1, allocated=10)
    s = FakeScheduler(reqs=[a])
    run = Run(s, disabled=["pause", "continue"])
    run.dispatch(abort(everything=True))
    s.running_batch.reqs = []
    a.kv.req_pool_idx = None
    s.waiting_queue = [a]
    run.dispatch(abort("a"))
    s.waiting_queue = []
    assert run.check() is None and not run.mem.aborts


def test_pause_on_pp_lets_forwards_launched_before_it_deliver_for_one_round():
    a = FakeReq("a", row=1, allocated=10)
    s = FakeScheduler(reqs=[a])
    s.mbs = [None] * 6  # 6 microbatch slots: a PP scheduler

    s.__dict__["_scripted_runtime_loop_kind"] = "pp"
    run = Run(s)
    run.dispatch(PAUSE_IN_PLACE)
    for _ in range(6):  # results of slots launched before the pause
        a.output_ids.append(1)
        assert run.check() is None
    assert run.check() is None  # the baseline, one round after the pause
    a.output_ids.append(1)
    v = run.check()
    assert v.invariant == "pause" and "while paused" in v.message


class _GatedScheduler(FakeScheduler):
    """A release whose flush lets waiting requests be during a pause (0.5.21+)."""

    def is_fully_idle(self, for_health_check=False, ignore_waiting=False):
        return self._idle


def _refused_flush(s):
    run = Run(s)
    run.dispatch(req_input("FlushCacheReqInput"), _flush_output(False))
    return run.check()


def test_a_flush_is_not_refused_when_nothing_is_held():
    v = _refused_flush(FakeScheduler(reqs=[]))
    assert v.invariant == "flush" and "flush_cache refused, though nothing is held anywhere" in v.message


def test_a_flush_during_a_pause_with_only_waiting_requests_must_be_accepted_where_the_release_says_so():
    waiting = FakeReq("w", row=None, allocated=0)
    s = _GatedScheduler(reqs=[])
    s.waiting_queue, s._engine_paused = [waiting], True
    v = _refused_flush(s)
    assert v.invariant == "flush" and "paused and only waiting requests are held (1, none holding KV)" in v.message
    old = FakeScheduler(reqs=[])  # a release before 0.5.21: its flush waits for the waiting queue
    old.waiting_queue, old._engine_paused = [waiting], True
    assert _refused_flush(old) is None
    unpaused = _GatedScheduler(reqs=[])
    unpaused.waiting_queue = [waiting]
    assert _refused_flush(unpaused) is None


def test_a_flush_may_be_refused_while_anything_sits_in_a_batch():
    done = FakeReq("d", row=1, allocated=4, done=True)  # finished, not pruned yet: the gate still counts it
    s = FakeScheduler(reqs=[])
    s.last_batch = SimpleNamespace(reqs=[done], forward_mode=None)
    assert _refused_flush(s) is None


def _pp_scheduler(**slots):
    pp = _GatedScheduler(reqs=[])
    pp.__dict__["_scripted_runtime_loop_kind"] = "pp"
    pp.mbs, pp.last_mbs, pp.running_mbs = [None] * 4, [None] * 4, [SimpleNamespace(reqs=[])] * 4
    for name, value in slots.items():
        setattr(pp, name, value)
    return pp


def test_under_pp_a_flush_may_be_refused_while_a_micro_batch_slot_holds_a_request_and_not_otherwise():
    # SGLang's gate under PP adds _pp_microbatches_drained (every running_mbs and mbs entry empty);
    # the driver rank's flush is the one that answers the client
    in_flight = SimpleNamespace(reqs=[FakeReq("x", row=2, allocated=8)], forward_mode=None)
    for slot in ("mbs", "last_mbs", "running_mbs"):
        assert _refused_flush(_pp_scheduler(**{slot: [None, in_flight, None, None]})) is None, slot
    v = _refused_flush(_pp_scheduler())
    assert v.invariant == "flush" and "nothing is held anywhere" in v.message
    waiting = FakeReq("w", row=None, allocated=0)
    paused = _pp_scheduler(waiting_queue=[waiting], _engine_paused=True)
    v = _refused_flush(paused)
    assert v.invariant == "flush" and "paused and only waiting requests are held" in v.message


# --- memory_occupation: release/resume_memory_occupation --------------------------------------------


def _release(tags=None):
    return req_input("ReleaseMemoryOccupationReqInput", tags=tags)


def _resume(tags=None):
    return req_input("ResumeMemoryOccupationReqInput", tags=tags)


def test_a_release_of_the_kv_cache_must_leave_the_pools_flushed_and_the_tags_recorded():
    s = FakeScheduler(reqs=[])
    s.offload_tags = {"kv_cache"}  # SGLang's record (0.5.2x keeps it on weight_updater; older on the scheduler)
    run = Run(s)
    run.dispatch(_release(["kv_cache"]))
    assert run.check() is None, "flushed pools and the tag recorded: nothing to report"
    s.tree_cache._evictable = 7  # the release left the tree over released KV
    run.dispatch(_release(["kv_cache"]))
    v = run.check()
    assert v.invariant == "memory_occupation" and "7 tokens still in the tree" in v.message
    s.tree_cache._evictable = 0
    s.offload_tags = set()
    run.dispatch(_release(["weights"]))  # no flush asked; the tag missing from SGLang's record
    v = run.check()
    assert v.invariant == "memory_occupation" and "offload_tags lacks weights" in v.message


def test_a_resume_must_drop_its_tags_and_no_forward_runs_while_kv_or_weights_are_released():
    a = FakeReq("a", row=1, allocated=10)
    s = FakeScheduler(reqs=[a])
    s.offload_tags = {"kv_cache", "cuda_graph"}
    run = Run(s)
    run.dispatch(_resume(["kv_cache"]))  # processed, yet SGLang still records it
    v = run.check()
    assert v.invariant == "memory_occupation" and "still holds kv_cache" in v.message
    run.launch(a)
    v = run.check()
    assert v.invariant == "memory_occupation" and "while kv_cache memory was released" in v.message
    s.offload_tags = {"cuda_graph"}  # graphs alone: a CPU forward does not use them
    run.launch(a)
    assert run.check() is None


def test_a_resume_of_weights_must_put_back_the_buffers_the_release_found():
    torch = pytest.importorskip("torch")
    model = torch.nn.Module()
    model.register_buffer("cos_sin_cache", torch.arange(6.0))
    s = FakeScheduler(reqs=[])
    s.tp_worker = SimpleNamespace(model_runner=SimpleNamespace(model=model))
    s.offload_tags = {"weights"}
    run = Run(s)
    run.dispatch(_release(["weights"]))  # the contract copies the buffers before SGLang's handler runs
    model.cos_sin_cache.fill_(7.0)  # what the release lost
    assert run.check() is None
    s.offload_tags = set()
    run.dispatch(_resume(["weights"]))  # SGLang's import did not run
    v = run.check()
    assert v.invariant == "memory_occupation" and "cos_sin_cache differ" in v.message
    s.offload_tags = {"weights"}
    run.dispatch(_release(["weights"]))
    s.offload_tags = set()
    run.dispatch(_resume(["weights"]))  # nothing changed in between: quiet
    assert run.check() is None


@pytest.mark.parametrize("flush", [False, True])
def test_an_update_that_did_not_load_must_leave_the_weights_and_their_version(monkeypatch, flush):
    """0.5.23 records an update's weight_version only once it loaded, and a
    disk update that fails to load rolls the weights back: an update that
    answers failure without a flush, or with a checkpoint path that does not
    exist, serves what was served before it. With a flush and a checkpoint
    that exists, a failure may be the flush refused after the load, which
    changes both (SGLang's meaning): not judged."""
    from scripted_runtime.hooks import sglang_compat
    from scripted_runtime.scheduler_side import update_sources

    served = {"weights": (1.0,), "version": "v1"}
    monkeypatch.setattr(update_sources, "weights_fingerprint", lambda s: served["weights"])
    monkeypatch.setattr(sglang_compat, "served_weight_version", lambda: served["version"])
    missing = req_input("UpdateWeightFromDiskReqInput", flush_cache=flush, model_path="/nonexistent/ckpt",
                        weight_version="v2")

    def failed(change):
        run = Run(FakeScheduler(reqs=[]))
        before = run.mem.before_dispatch(run.s, missing)
        served.update(change)
        run.mem.on_dispatch(run.s, missing, _flush_output(False), 0, before)
        return run.check()

    assert failed({}) is None
    v = failed({"version": "v2"})
    assert v.invariant == "update_weights" and "answered failure, yet the served weight version changed from " \
        "'v1' to 'v2'" in v.message
    served.update(weights=(1.0,), version="v1")
    v = failed({"weights": (2.0,)})
    assert v.invariant == "update_weights" and "answered failure, yet the weights served changed" in v.message
    served.update(weights=(1.0,), version="v1")
    if flush:  # an existing checkpoint with a flush: a refused flush after the load changes both
        existing = req_input("UpdateWeightFromDiskReqInput", flush_cache=True, model_path="/", weight_version="v2")
        run = Run(FakeScheduler(reqs=[FakeReq("a", row=1, allocated=10)]))
        before = run.mem.before_dispatch(run.s, existing)
        served.update(weights=(2.0,), version="v2")
        run.mem.on_dispatch(run.s, existing, _flush_output(False), 0, before)
        assert run.check() is None
