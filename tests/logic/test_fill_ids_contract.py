"""The ``fill_ids`` contract (docs/checks.md, "The fill ids") on fakes: an
extend's requests, as the driver records them at the launch, against their
prompt and output. On a real server: ``mut_fill_ids_refresh_discards_append``
in the kill table, and the pp4 resume of tests/server/test_fill_ids.py."""
from __future__ import annotations

from array import array

from scripted_runtime.hooks import sglang_compat
from scripted_runtime.scheduler_side.invariants import InvariantChecker, StateView
from scripted_runtime.scheduler_side.run_counters import BatchRecord
from tests.fakes import FakeReq, FakeScheduler

PROMPT = [5, 6, 7, 8]


def _req(rid, output=(), fill=None, done=False):
    """A request as 0.5.23 holds it: prompt and output as ``array('q')``; its
    fill ids refreshed (the prompt then the output) unless ``fill`` says."""
    req = FakeReq(rid, done=done)
    req.origin_input_ids = array("q", PROMPT)
    req.output_ids = array("q", output)
    req.full_untruncated_fill_ids = array("q", PROMPT + list(output) if fill is None else fill)
    return req


def test_refreshed_fill_ids_are_in_sync_and_stale_or_doubled_ones_are_not():
    assert sglang_compat.fill_ids_desync(_req("fresh")) is None
    assert sglang_compat.fill_ids_desync(_req("resumed", output=(9, 10))) is None
    # the mutant's resume: the output's append discarded, the prompt alone
    assert sglang_compat.fill_ids_desync(_req("stale", output=(9, 10), fill=PROMPT)) == ("stale", 4, 4, 2, 4)
    # a session turn that appended the output twice
    assert sglang_compat.fill_ids_desync(_req("doubled", output=(9,), fill=PROMPT + [9, 9])) == ("doubled", 6, 4, 1, 5)
    # same length, another token
    assert sglang_compat.fill_ids_desync(_req("wrong", output=(9,), fill=[5, 6, 1, 8, 9])) == ("wrong", 5, 4, 1, 2)


def test_not_judged_finished_requests_and_releases_without_the_field():
    assert sglang_compat.fill_ids_desync(_req("done", output=(9,), fill=PROMPT, done=True)) is None
    old = FakeReq("old")  # a release keeping fill_ids, not full_untruncated_fill_ids
    old.fill_ids = [1]
    assert sglang_compat.fill_ids_desync(old) is None


class Run:
    def __init__(self, disabled=()):
        self.s = FakeScheduler(reqs=[FakeReq(rid, row=i + 1, allocated=4) for i, rid in enumerate("ab")])
        # the per-iteration invariants off (they judge the fakes' pools); every contract on
        self.checker = InvariantChecker(["idle_gate", "slot_ownership", "radix_locks", "pool_accounting",
                                         *disabled])
        self.log = []

    def launch(self, mode, *desync):
        self.log.append(BatchRecord(len(self.log), None, mode, tuple(d[0] for d in desync) or ("a",), None,
                                    fill_desync=tuple(desync)))

    def check(self):
        return self.checker.check(StateView(self.s), step=len(self.log), batch_log=self.log, tracked={})


def test_an_extend_reading_stale_fill_ids_is_a_violation_naming_the_request_once():
    run = Run()
    run.launch("extend")
    assert run.check() is None
    run.launch("extend", ("a", 4, 4, 2, 4))
    v = run.check()
    assert v is not None and v.name == "fill_ids" and v.kind == "ContractViolation"
    assert ("the extend launched at step 1 reads fill ids that are not the prompt followed by the output: a's fill "
            "ids hold 4 tokens where its prompt (4) and output (2) hold 6, first differing at position 4") in v.message
    assert set(v.owners) == {"a"}
    assert run.check() is None  # each launch judged once


def test_switched_off_by_name():
    run = Run(disabled=("fill_ids",))
    run.launch("extend", ("a", 4, 4, 2, 4))
    assert run.check() is None
