"""The ``lora`` contract (``scheduler_side/lora_contract.py``) on small
fakes (pure logic; against the real scheduler: tests/server/test_lora.py and
the LoRA mutants of the kill table)."""
from __future__ import annotations

from types import SimpleNamespace

from scripted_runtime.hooks import sglang_compat
from scripted_runtime.scheduler_side import lora_contract
from scripted_runtime.scheduler_side.invariants import InvariantChecker, StateView
from scripted_runtime.scheduler_side.run_counters import BatchRecord
from tests.fakes import FakeReq, FakeScheduler


def _lora_scheduler(reqs, loaded, slots=2):
    """A fake scheduler with LoRA on: ``loaded`` maps lora_id -> name."""
    s = FakeScheduler(reqs=reqs)
    s.enable_lora = True
    refs = {lid: SimpleNamespace(lora_name=name, lora_path=f"/adapters/{name}") for lid, name in loaded.items()}
    manager = SimpleNamespace(lora_refs=refs, memory_pool=SimpleNamespace(max_loras_per_batch=slots,
                                                                          uid_to_buffer_id={}))
    s.tp_worker = SimpleNamespace(model_runner=SimpleNamespace(lora_manager=manager))
    return s


def _req(rid, lora_id, row, done=False):
    r = FakeReq(rid, row=row, allocated=4, done=done)
    r.lora_id = lora_id
    return r


class Run:
    def __init__(self, s):
        self.s = s
        self.checker = InvariantChecker(["idle_gate", "slot_ownership", "radix_locks", "pool_accounting"])
        self.log = []
        self.step = 0

    def forward(self, rids, mode="decode"):
        self.log.append(BatchRecord(self.step, None, mode, tuple(rids), None))

    def check(self):
        v = self.checker.check(StateView(self.s), step=self.step, batch_log=self.log, tracked={})
        self.step += 1
        return v


def test_the_compat_layer_reads_the_lora_manager():
    s = _lora_scheduler([], {"id0": "lora0", "id1": "lora1"}, slots=2)
    assert sglang_compat.lora_enabled(s)
    assert sglang_compat.loaded_lora_names(s) == ("lora0", "lora1")
    assert sglang_compat.max_loras_per_batch(s) == 2
    plain = FakeScheduler()
    assert not sglang_compat.lora_enabled(plain) and sglang_compat.loaded_lora_names(plain) == ()


def test_a_forward_within_the_slots_passes_and_one_past_them_is_a_violation_naming_the_adapters():
    reqs = [_req("a", "id0", 1), _req("b", "id1", 2), _req("c", None, 3), _req("d", "id2", 4)]
    run = Run(_lora_scheduler(reqs, {"id0": "lora0", "id1": "lora1", "id2": "lora2"}))
    run.forward("ab")
    assert run.check() is None
    run.forward("aa" "c")  # one adapter and the base model: two
    assert run.check() is None
    run.forward("abc")  # two adapters and the base model (which SGLang counts): three for two slots
    v = run.check()
    assert v is not None and v.name == "lora"
    assert "holds 3 adapters (lora0, lora1, base): max_loras_per_batch is 2" in v.message


def test_an_unfinished_request_whose_adapter_is_gone_is_a_violation_a_finished_one_is_not():
    reqs = [_req("a", "id0", 1), _req("b", "gone", 2, done=True)]
    run = Run(_lora_scheduler(reqs, {"id0": "lora0"}))
    assert run.check() is None, "a finished request may name an adapter unloaded since"
    reqs[1].done = False
    v = run.check()
    assert v is not None and v.name == "lora" and "request b is unfinished" in v.message


def test_the_dispatch_rules_judge_load_and_unload_answers():
    s = _lora_scheduler([], {})
    mem = lora_contract.LoraMemory()
    load = type("LoadLoRAAdapterReqInput", (SimpleNamespace,), {})(lora_id="id9", lora_name="lora9")
    before = mem.before_dispatch(s, load)
    mem.on_dispatch(s, load, SimpleNamespace(success=True), 0, before)
    assert mem.problems and "answered success, yet the LoRA manager does not hold it" in mem.problems[0]
    mem.problems.clear()
    s.tp_worker.model_runner.lora_manager.lora_refs["id9"] = SimpleNamespace(lora_name="lora9")
    unload = type("UnloadLoRAAdapterReqInput", (SimpleNamespace,), {})(lora_id="id9", lora_name="lora9")
    before = mem.before_dispatch(s, unload)
    mem.on_dispatch(s, unload, SimpleNamespace(success=False, error_message="busy"), 0, before)
    assert mem.problems and "was refused" in mem.problems[0]
    mem.problems.clear()
    mem.on_dispatch(s, unload, SimpleNamespace(success=True), 0, before)
    assert mem.problems and "still holds it" in mem.problems[0]
    mem.problems.clear()
    del s.tp_worker.model_runner.lora_manager.lora_refs["id9"]
    mem.on_dispatch(s, unload, SimpleNamespace(success=True), 0, before)
    assert not mem.problems


def test_a_dispatch_problem_is_reported_once_and_only_when_the_contract_is_on():
    run = Run(_lora_scheduler([], {}))
    run.checker.memory.lora.problems.append("unload_lora_adapter('x') ... still holds it")
    v = run.check()
    assert v is not None and v.name == "lora" and "still holds it" in v.message
    assert run.check() is None
    off = InvariantChecker(["idle_gate", "slot_ownership", "radix_locks", "pool_accounting", "lora"])
    off.memory.lora.problems.append("x")
    assert off.check(StateView(run.s), step=0, batch_log=[], tracked={}) is None
