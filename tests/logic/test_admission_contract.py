"""The ``admission_budget`` contract (docs/checks.md, "The admission budget")
on fakes: what a prefill pass admitted, as the driver records it, against
the free and evictable KV the pass began with. On a real server:
tests/server/test_admission.py, and ``mut_prefill_budget_ignores_admitted_extend``
in the kill table."""
from __future__ import annotations

from types import SimpleNamespace

from scripted_runtime.hooks import sglang_compat
from scripted_runtime.scheduler_side.invariants import InvariantChecker, StateView
from scripted_runtime.scheduler_side.run_counters import BatchRecord, admitted_in_pass
from tests.fakes import FakeReq, FakeScheduler


def _req(rid, max_new, output=0):
    req = FakeReq(rid)
    req.sampling_params = SimpleNamespace(max_new_tokens=max_new)
    req.output_ids = [7] * output
    return req


class Run:
    def __init__(self):
        self.s = FakeScheduler(reqs=[FakeReq(rid, row=i + 1, allocated=4) for i, rid in enumerate("abc")])
        # the per-iteration invariants off (they judge the fakes' pools); every contract on
        self.checker = InvariantChecker(["idle_gate", "slot_ownership", "radix_locks", "pool_accounting"])
        self.log = []

    def prefill(self, free, evictable, admitted, page=1):
        """``admitted``: (rid, extend, new tokens charged)."""
        self.log.append(BatchRecord(len(self.log), None, "extend", tuple(a[0] for a in admitted), None,
                                    admission=((free, evictable, page), tuple(admitted))))

    def check(self):
        return self.checker.check(StateView(self.s), step=len(self.log), batch_log=self.log, tracked={})


def test_a_pass_within_its_free_and_evictable_kv_passes():
    run = Run()
    run.prefill(13, 8, [("a", 8, 1), ("b", 8, 1)])  # 20 tokens with their pages, 21 there
    assert run.check() is None


def test_a_pass_over_its_room_is_a_violation_naming_each_request_and_the_pool():
    run = Run()
    run.prefill(14, 0, [("a", 8, 1), ("b", 8, 1)])  # the corpus's kv_pressure_two_arrive, over-admitted
    v = run.check()
    assert v is not None and v.name == "admission_budget" and v.kind == "ContractViolation"
    assert "admitted a (8 extend + 1 new + 1 page), b (8 extend + 1 new + 1 page): 20 KV tokens" in v.message
    assert "14 free and 0 evictable (14)" in v.message
    assert set(v.owners) == {"a", "b"}


def test_the_rule_is_strict_and_counts_a_page_per_request():
    """SGLang admits a request only if its need is *less than* what is left:
    a need equal to the room is over it; a larger page raises each need."""
    run = Run()
    run.prefill(20, 0, [("a", 8, 1), ("b", 8, 1)])
    assert run.check() is not None
    run.prefill(21, 0, [("a", 8, 1), ("b", 8, 1)])
    assert run.check() is None
    run.prefill(21, 0, [("a", 8, 1), ("b", 8, 1)], page=4)
    assert "26 KV tokens" in run.check().message


def test_each_pass_is_judged_once_and_a_record_without_admission_is_not_judged():
    run = Run()
    run.prefill(4, 0, [("a", 8, 1)])
    assert run.check() is not None
    assert run.check() is None  # judged already
    run.log.append(BatchRecord(len(run.log), None, "extend", ("b",), None))  # a pass the driver did not judge
    assert run.check() is None


def test_switched_off_by_name():
    run = Run()
    run.checker = InvariantChecker(["idle_gate", "slot_ownership", "radix_locks", "pool_accounting",
                                    "admission_budget"])
    run.prefill(4, 0, [("a", 8, 1)])
    assert run.check() is None


def test_what_a_pass_admitted_leaves_out_the_continued_chunk_and_charges_a_new_chunk_no_decode():
    continued, whole, chunked = _req("c", 5, output=0), _req("w", 12, output=3), _req("n", 9)
    admitted = admitted_in_pass([continued, whole, chunked], [64, 20, 30], continued, chunked)
    # the continuation is SGLang's to push through; a retracted request is charged its new tokens left
    assert admitted == (("w", 20, 9), ("n", 30, 0))


def test_new_tokens_are_clipped_as_sglang_clips_them(monkeypatch):
    monkeypatch.setattr(sglang_compat, "_clip_max_new_tokens", lambda: 4096)
    assert sglang_compat.admitted_new_tokens(_req("a", 1 << 20)) == 4096
    assert sglang_compat.admitted_new_tokens(_req("b", 3, output=5)) == 0


def test_which_schedulers_are_judged():
    s = FakeScheduler()
    assert sglang_compat.admission_unjudged(s) is None
    s.enable_priority_preemption = True
    assert sglang_compat.admission_unjudged(s) == "priority preemption"
    s = FakeScheduler()
    s.enable_hierarchical_cache = True
    assert sglang_compat.admission_unjudged(s) == "HiCache"
    s = FakeScheduler()
    s.tree_cache.disable = True
    assert sglang_compat.admission_unjudged(s) == "the radix tree disabled"
    free, evictable, page = sglang_compat.admission_room(FakeScheduler(evictable=5))
    assert (free, evictable, page) == (sglang_compat.admission_room(FakeScheduler())[0] - 5, 5, 1)
