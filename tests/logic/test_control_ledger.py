"""Control operations (``scheduler_side/control.py``): the ledger matching
the scheduler's answers to the operations in order, an operation's verdict
falling back to its HTTP answer, and whether the tokenizer counts as
paused. Small stand-ins of SGLang's request classes; no SGLang process."""
from __future__ import annotations

from scripted_runtime.scheduler_side.control import ControlLedger, ControlOp, pause_posted_last
from scripted_runtime.scheduler_side.http_poster import HttpAnswer


class _Req:
    def __init__(self, rid=None):
        self.rid = rid


class FlushCacheReqInput(_Req):
    pass


class AbortReq(_Req):
    pass


class _Out:
    def __init__(self, success):
        self.success = success
        self.message = "m"


def test_ledger_matches_answers_to_ops_in_order():
    step = {"v": 1}
    ledger = ControlLedger(lambda: step["v"])
    a = ledger.register(ControlOp("flush", "FlushCacheReqInput", None, 0, HttpAnswer()))
    b = ledger.register(ControlOp("flush", "FlushCacheReqInput", None, 0, HttpAnswer()))
    ab = ledger.register(ControlOp("abort", "AbortReq", "r2", 0, HttpAnswer()))
    ledger.on_processed(AbortReq("r1"), None)  # someone else's abort
    assert not ab.processed
    ledger.on_processed(FlushCacheReqInput(), _Out(False))
    step["v"] = 2
    ledger.on_processed(FlushCacheReqInput(), _Out(True))
    ledger.on_processed(AbortReq("r2"), None)
    assert (a.success, a.processed_step) == (False, 1)
    assert (b.success, b.processed_step) == (True, 2)
    assert ab.processed and ab.success is True  # processed, no verdict to give
    assert [d["op"] for d in ledger.log()] == ["flush", "flush", "abort"]


def test_op_success_falls_back_to_http():
    op = ControlOp("pause", "PauseGenerationReqInput", None, 0, HttpAnswer())
    assert op.success is None
    op.http.status, op.http.body = 400, {"success": False, "message": "nope"}
    assert op.success is False and op.message == "nope"


def test_the_tokenizer_counts_as_paused_after_a_pause_until_a_continue():
    def op(name):
        return ControlOp(name, "X", None, 0, HttpAnswer())

    assert pause_posted_last([]) is False
    assert pause_posted_last([op("flush_cache")]) is False
    assert pause_posted_last([op("pause_generation(retract)"), op("flush_cache")]) is True
    assert pause_posted_last([op("pause_generation(in_place)"), op("continue_generation")]) is False
    assert pause_posted_last([op("continue_generation"), op("pause_generation(abort)"), op("abort(r1)")]) is True


class PauseGenerationReqInput(_Req):
    pass


def test_an_answered_op_whose_request_reached_the_scheduler_is_unsettled_until_processed():
    """SGLang's tokenizer answers a retract pause right after sending it on:
    the answer alone does not settle it (the RL cycle's release waited on
    that and raced the answer). One answered that never reached the
    scheduler (an abort pause, a refusal) is settled by its answer."""
    ledger = ControlLedger(lambda: 7)
    retract = ledger.register(ControlOp("pause_generation(retract)", "PauseGenerationReqInput", None, 0, HttpAnswer()))
    abort = ledger.register(ControlOp("pause_generation(abort)", "PauseGenerationReqInput", None, 0, HttpAnswer(),
                                      forwarded=False))
    ledger.ops.reverse()  # the abort pause posted first: the retract's request is still not its
    assert ledger.unprocessed_of_type("PauseGenerationReqInput") == [abort, retract]
    ledger.on_arrival(PauseGenerationReqInput())  # the retract's request reached the scheduler's socket
    for op in (retract, abort):
        op.http.status = 200
        op.http.mark_answered()
    assert not retract.settled and abort.settled
    assert ledger.unprocessed_of_type("PauseGenerationReqInput") == [retract] == ledger.unsettled()
    ledger.on_processed(PauseGenerationReqInput(), None)
    assert retract.settled and ledger.unprocessed_of_type("PauseGenerationReqInput") == [] == ledger.unsettled()
