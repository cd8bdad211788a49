"""The one registry of checks and windows (``scheduler_side/check_registry.py``):
every built-in check and a user's extension invariant are in it, in the
order the CLI lists them, and each reports a ``Violation`` (pure logic, on
the fakes the other logic tests use)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from scripted_runtime import extensions as ext
from scripted_runtime.hooks import hicache_gate
from scripted_runtime.scheduler_side import check_registry, contracts, invariants, runtime_contracts, windows
from scripted_runtime.scheduler_side.check_registry import Violation
from scripted_runtime.scheduler_side.invariants import InvariantChecker, InvariantMemory, StateView
from tests.fakes import FakeReq, FakeScheduler
from tests.logic.test_hicache_gate import _host_scheduler, _node, _scheduler

BUILTIN_ORDER = ("idle_gate", "slot_ownership", "radix_locks", "pool_accounting", "hicache_load_before_read",
                 "hicache_transfer_slots", "hicache_host_accounting", "pause", "continue", "abort", "flush",
                 "update_weights", "memory_occupation", "runtime_limits", "weight_queries", "sessions", "diagnostics", "lora",
                 "priority", "admission_budget", "fill_ids", "greedy_output", "request_semantics", "logprobs", "answer_delivery", "weight_versions", "request_survival")


@pytest.fixture
def clean_extensions(monkeypatch):
    monkeypatch.setattr(check_registry, "_extension_checks", {})
    monkeypatch.setattr(check_registry, "_extension_windows", {})
    monkeypatch.setattr(ext, "_actions", {})
    monkeypatch.setattr(ext, "_registered", set())
    monkeypatch.setattr(windows, "WINDOWS", dict(windows.WINDOWS))


@pytest.fixture
def gate(monkeypatch):
    g = hicache_gate.TransferGate()
    monkeypatch.setattr(hicache_gate, "_gate", g)
    return g


def _run(name):
    return next(c.run for c in check_registry.builtin_checks() if c.name == name)


def test_every_builtin_check_is_registered_in_order_with_its_group():
    assert check_registry.names() == BUILTIN_ORDER == invariants.NAMES
    groups = {c.name: c.group for c in check_registry.builtin_checks()}
    assert [n for n in BUILTIN_ORDER if groups[n] == "hicache"] == list(invariants.INVARIANT_NAMES[4:])
    assert check_registry.names("contract") == contracts.NAMES + runtime_contracts.NAMES + ("lora", "priority", "admission_budget", "fill_ids") == \
        invariants.CONTRACT_NAMES
    assert check_registry.names("end_check") == ("greedy_output", "request_semantics", "logprobs",
                                                 "answer_delivery", "weight_versions", "request_survival")
    assert all(c.doc for c in check_registry.builtin_checks())
    # the control contracts are one check under six names, the runtime ones another under three, LoRA's a
    # third, priority's a fourth, the admission budget a fifth, the fill ids a sixth; the end checks run at a
    # program's end
    assert len({c.run for c in check_registry.builtin_checks() if c.group == "contract"}) == 6
    assert [c.name for c in check_registry.builtin_checks() if c.run is None] == [
        "greedy_output", "request_semantics", "logprobs", "answer_delivery", "weight_versions", "request_survival"]
    assert [check_registry.kind_of(n) for n in ("abort", "slot_ownership", "greedy_output")] == [
        "ContractViolation", "InvariantViolation", "InvariantViolation"]


def test_the_builtin_windows_are_the_registrys():
    assert windows.BUILTIN == frozenset(check_registry.builtin_windows())
    assert list(windows.WINDOWS)[:2] == ["pp_inflight_after_last_chunk", "finished_not_pruned"]
    assert windows.WINDOWS["hicache_load_in_progress"].needs == "hicache"


def _broken_states():
    """For each per-iteration invariant: a fake scheduler state that breaks it."""
    gone = FakeReq("g", row=2, allocated=4)
    gone.last_node = SimpleNamespace(id=7, parent=None)  # a node of a tree that was reset
    return {
        "idle_gate": FakeScheduler(idle=True, reqs=[FakeReq("a", row=1, allocated=10)]),
        "slot_ownership": FakeScheduler(reqs=[FakeReq("a", row=3), FakeReq("b", row=3)]),
        "radix_locks": FakeScheduler(reqs=[gone]),
        "pool_accounting": FakeScheduler(idle=True, reqs=[], free_kv=torch.arange(0, 95), evictable=0),
    }


@pytest.mark.parametrize("name", ["idle_gate", "slot_ownership", "radix_locks", "pool_accounting"])
def test_each_core_invariant_reports_a_violation_through_the_registry(name):
    v = _run(name)(StateView(_broken_states()[name]), InvariantMemory())
    assert isinstance(v, Violation) and v.name == v.invariant == name and v.kind == "InvariantViolation"


def test_each_hicache_check_reports_a_violation_through_the_registry(gate):
    memory = InvariantMemory()
    gate.unwaited_reads.append({"transfer": 1, "rid": "r", "mode": "decode", "slots": [3], "n_slots": 1,
                                "consumer_index": 0})
    s = _scheduler()
    v = _run("hicache_load_before_read")(SimpleNamespace(s=s), memory)
    assert isinstance(v, Violation) and v.name == "hicache_load_before_read"
    gate.hold(backups=True)
    t = gate.submit("backup", torch.tensor([4]), torch.tensor([0]), lambda: None)
    t.completion = SimpleNamespace(finish_event=hicache_gate.GateEvent(t))
    counts = np.zeros(8, dtype=np.int32)
    counts[4] = 1
    v = _run("hicache_transfer_slots")(SimpleNamespace(s=s), SimpleNamespace(free_kv_counts=lambda s: counts))
    assert isinstance(v, Violation) and v.name == "hicache_transfer_slots"
    leak = _host_scheduler([1, 2], _node(torch.tensor([1])))
    v = _run("hicache_host_accounting")(SimpleNamespace(s=leak), memory)
    assert isinstance(v, Violation) and v.name == "hicache_host_accounting"
    # registered gated: with HiCache off (no cache controller) none of them runs
    gate.unwaited_reads.append({"transfer": 1, "rid": "r", "mode": "decode", "slots": [3], "n_slots": 1,
                                "consumer_index": 0})
    off = SimpleNamespace(s=SimpleNamespace(tree_cache=SimpleNamespace()))
    assert _run("hicache_load_before_read")(off, memory) is None and gate.unwaited_reads


def test_the_contracts_report_a_violation_through_the_registry():
    a = FakeReq("a", row=1, allocated=10)
    s = FakeScheduler(reqs=[a])
    memory = InvariantMemory()
    pause = type("PauseGenerationReqInput", (), {"mode": "in_place"})()
    memory.contracts.on_dispatch(s, pause, None, 0, memory.contracts.before_dispatch(s, pause))
    memory.step_inputs = invariants.StepInputs(step=0, batch_log=[SimpleNamespace(
        step=0, slot=None, mode="decode", rids=("a",))])
    v = _run("pause")(StateView(s), memory)
    assert isinstance(v, Violation) and v.name == "pause" and v.kind == "ContractViolation"
    assert v.owners == {"a": {"row": 1, "holders": ["running_batch"]}}


def test_an_extension_invariant_registers_in_the_same_registry_and_reports_a_violation(clean_extensions):
    @ext.invariant
    def nothing_running(view):
        "No request is running."
        return f"{len(view.live)} live" if view.live else None

    entry = check_registry.extension_checks()["nothing_running"]
    assert (entry.group, entry.doc) == ("extension", "No request is running.")
    s = FakeScheduler(reqs=[FakeReq("a", row=1, allocated=10)])
    v = entry.run(StateView(s), InvariantMemory())
    assert isinstance(v, Violation) and (v.name, v.message, v.kind) == ("nothing_running", "1 live",
                                                                        "InvariantViolation")
    assert invariants.all_names() == BUILTIN_ORDER + ("nothing_running",)
    checker = InvariantChecker(list(invariants.INVARIANT_NAMES))  # only contracts and the extension on
    assert checker.check(StateView(s)).headline() == "InvariantViolation[nothing_running]: 1 live"
    assert InvariantChecker(["nothing_running", *invariants.INVARIANT_NAMES]).check(StateView(s)) is None


def test_an_extension_window_registers_in_the_same_registry(clean_extensions):
    @ext.window(loops=("normal",))
    def always(scheduler):
        "Always open."
        return "yes"

    assert check_registry.extension_windows()["always"].predicate is always
    ext.register_windows()
    assert windows.WINDOWS["always"] == check_registry.Window("always", ("normal",), "extension", "Always open.",
                                                               always)
