"""``explore.pause(ctx, reqs, "abort")`` (scheduler_side/explore/program.py)
on a small stand-in for ``ctx``: once answered, a pause whose first round
found a forwarded request still unanswered takes the tokenizer's last
``abort_all`` (sent right before the answer) and lets one iteration process
it, so nothing of the pause is left for the next operation; a pause with no
such request looks for nothing; and the answers of requests the scheduler
already ended are awaited first, so the first round's finding is no race."""
from __future__ import annotations

from types import SimpleNamespace

from scripted_runtime.scheduler_side.explore import program


class _Answer:
    def __init__(self, done: bool) -> None:
        self.done = done

    def wait(self, timeout_s: float) -> bool:
        return True


class _Ctx:
    def __init__(self, last_abort_arrives: bool) -> None:
        self.scheduler = SimpleNamespace()
        self.looked_for = []
        self._arrives = last_abort_arrives

    def pause_generation(self, mode):
        return SimpleNamespace(http=_Answer(True), name=f"pause_generation({mode})")

    def await_frame(self, request_type, timeout_s):
        self.looked_for.append((request_type, timeout_s))
        return self._arrives


def _handle(*, finished: bool, answered: bool, status: str = "running", arrived: bool = False):
    return SimpleNamespace(finished=finished, http=_Answer(answered), status=status, rid="r", arrived=arrived)


def _steps(gen) -> int:
    n = 0
    try:
        while True:
            next(gen)
            n += 1
    except StopIteration:
        return n


def test_the_last_abort_of_a_pause_that_found_a_request_in_flight_is_processed(monkeypatch):
    monkeypatch.setattr(program, "_slots", lambda ctx: 1)
    ctx = _Ctx(last_abort_arrives=True)
    # a request the tokenizer forwarded, not answered when the pause was posted (still running here)
    steps = _steps(program.pause(ctx, [_handle(finished=True, answered=False)], "abort"))
    assert ctx.looked_for == [("AbortReq", program.LAST_ABORT_GRACE_S)]
    assert steps == 1, "one iteration processes the last abort_all"


def test_a_request_started_in_the_same_step_is_in_flight_though_not_ingested(monkeypatch):
    """Posted and not ingested yet, but its request reached the scheduler's
    socket: the tokenizer forwarded it, so it holds the lock and the pause's
    first round finds it (the pp4 corpus program that starts a request and
    pauses with abort in one step raced the last abort_all otherwise)."""
    monkeypatch.setattr(program, "_slots", lambda ctx: 1)
    ctx = _Ctx(last_abort_arrives=True)
    started = _handle(finished=True, answered=False, status="posted", arrived=True)
    assert _steps(program.pause(ctx, [started], "abort")) == 1
    assert ctx.looked_for == [("AbortReq", program.LAST_ABORT_GRACE_S)]


def test_no_iteration_when_the_last_abort_does_not_come(monkeypatch):
    monkeypatch.setattr(program, "_slots", lambda ctx: 1)
    ctx = _Ctx(last_abort_arrives=False)
    assert _steps(program.pause(ctx, [_handle(finished=True, answered=False)], "abort")) == 0
    assert ctx.looked_for


def test_nothing_is_looked_for_without_a_forwarded_request_in_flight(monkeypatch):
    monkeypatch.setattr(program, "_slots", lambda ctx: 1)
    for reqs in ([], [_handle(finished=True, answered=True)],
                 [_handle(finished=True, answered=False, status="posted")]):  # kept back by the tokenizer
        ctx = _Ctx(last_abort_arrives=True)
        assert _steps(program.pause(ctx, reqs, "abort")) == 0
        assert ctx.looked_for == []


class _Landing:
    """An answer on its way: it lands during the first wait (or never)."""

    def __init__(self, lands: bool) -> None:
        self.done, self.lands, self.waits = False, lands, []

    def wait(self, timeout_s: float) -> bool:
        self.waits.append(timeout_s)
        self.done = self.done or self.lands
        return self.done


def test_the_answer_of_a_request_the_scheduler_ended_is_awaited_before_the_pause(monkeypatch):
    """Its answer, sent in the iteration that ended it, still holds the
    tokenizer's lock while on its way: awaited first (bounded, no step), so
    the pause's first round never finds it by a race with the clock."""
    monkeypatch.setattr(program, "_slots", lambda ctx: 1)
    ctx = _Ctx(last_abort_arrives=True)
    landing = _Landing(lands=True)
    ended = SimpleNamespace(http=landing, status="finished", finished=True, rid="r")
    assert _steps(program.pause(ctx, [ended], "abort")) == 0
    assert landing.waits and landing.waits[0] <= program.ENDED_ANSWER_WAIT_S
    assert ctx.looked_for == []  # not in flight any more: no last abort to take

    # an answer that does not come within the wait: the request counts as in flight, as before
    ctx = _Ctx(last_abort_arrives=True)
    lost = SimpleNamespace(http=_Landing(lands=False), status="aborted", finished=True, rid="r")
    assert _steps(program.pause(ctx, [lost], "abort")) == 1
    assert ctx.looked_for == [("AbortReq", program.LAST_ABORT_GRACE_S)]

    # a live request is not waited for (its answer needs iterations), nor anything for another mode
    running = SimpleNamespace(http=_Landing(lands=True), status="running", finished=False, rid="r")
    next(program.pause(_Ctx(last_abort_arrives=False), [running], "abort"))  # stepping until it ends
    assert running.http.waits == []
    gen = program.pause(_Ctx(last_abort_arrives=False), [ended_again := SimpleNamespace(
        http=_Landing(lands=True), status="finished", finished=True, rid="r")], "retract")
    assert _steps(gen) == 0 and ended_again.http.waits == []
