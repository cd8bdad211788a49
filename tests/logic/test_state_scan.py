"""The scan of the scheduler's state (``scheduler_side/state.py``) on a
stand-in scheduler: every place a request is held, live and finished. No
SGLang process."""
from __future__ import annotations


def test_state_scan_sees_every_place_and_tells_live_from_finished():
    """The scan walks running_batch, last_batch, chunked_req, the overlap
    result_queue, the PP slot lists and the waiting queue, each request once."""
    from types import SimpleNamespace as NS

    from scripted_runtime.scheduler_side import state

    def req(rid, done=False):
        return NS(rid=rid, finished=lambda: done)

    a, b, c, d = req("a"), req("b", done=True), req("c"), req("d")
    s = NS(running_batch=NS(reqs=[a]), last_batch=NS(reqs=[a, b]), chunked_req=None,
           result_queue=[(NS(reqs=[c]), object())], mbs=[None, NS(reqs=[b])], last_mbs=[], running_mbs=None,
           waiting_queue=[d])
    assert [h.label for h in state.holders(s)] == [
        "running_batch", "last_batch", "result_queue[0]", "mbs[1]", "waiting_queue"]
    assert [r.rid for r in state.iter_reqs(s)] == ["a", "b", "c", "d"]
    assert sorted(state.live_reqs(s)) == ["a", "c", "d"] and state.any_live(s)
    assert state.where_is(s, "b") == ["last_batch", "mbs[1]"]
    only_finished = NS(running_batch=NS(reqs=[b]), waiting_queue=[])
    assert not state.any_live(only_finished) and not state.nothing_held(only_finished)
    empty = NS(running_batch=None, waiting_queue=[])
    assert state.nothing_held(empty) and not state.any_live(empty)
