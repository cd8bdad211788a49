"""The explorer's swarm draw (strategies.py): every kind of control
operation drawn by family then kind, a program keeping some kinds only,
the operation sequences, and indices that keep their meaning whichever
kinds a program keeps. Pure logic, no server."""
from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, find, given, settings, strategies as st

from scripted_runtime.user_side.explore import actions as A, strategies as S
from tests.helpers import derandomized_draws

NO_DB = settings(database=None, max_examples=2000, derandomize=True)
PHASES = S.TARGET_PHASES["normal"]
CONTROL_TYPES = (A.Flush, A.AbortOne, A.AbortAll, A.UpdateWeights, A.Pause, A.Continue, A.ReleaseMemory,
                 A.ResumeMemory, A.RlCycle, A.SetLimit, A.SlowDown, A.WeightQuery, A.SessionOp)


def _name(op: A.Action) -> str:
    """The CONTROL_OP_KINDS name of a drawn control operation."""
    if isinstance(op, A.Pause):
        return f"pause_{op.mode}"
    if isinstance(op, A.WeightQuery):
        return f"query_{op.kind}"
    if isinstance(op, A.SessionOp):
        return f"session_{op.kind}"
    if isinstance(op, A.UpdateWeights):
        return ("update_missing" if op.missing else "update_distributed" if op.distributed else "update_tensor"
                if op.tensor else "update_disk")
    return {A.Flush: "flush", A.AbortOne: "abort_one", A.AbortAll: "abort_all", A.Continue: "continue",
            A.ReleaseMemory: "release_memory", A.ResumeMemory: "resume_memory", A.RlCycle: "rl_cycle",
            A.SetLimit: "set_limit", A.SlowDown: "slow_down"}[type(op)]


@pytest.mark.parametrize("name", S.CONTROL_OP_NAMES)
def test_every_kind_of_control_operation_is_drawn(name):
    assert _name(find(S.control_ops(), lambda op: _name(op) == name, settings=NO_DB)) == name


def test_the_kinds_are_the_grammars_operations_once_each():
    assert len(set(S.CONTROL_OP_NAMES)) == len(S.CONTROL_OP_NAMES)
    assert {f"query_{q}" for q in S.WEIGHT_QUERIES} <= set(S.CONTROL_OP_NAMES)
    assert {f"pause_{m}" for m in S.PAUSE_MODES} <= set(S.CONTROL_OP_NAMES)
    # the smallest control operation is the first kind (a flush): what a failure shrinks towards
    assert find(S.control_ops(), lambda op: True, settings=NO_DB) == A.Flush()


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_a_control_operation_is_one_of_the_kinds_kept_and_placed_ones_undo_nothing(data):
    kept = tuple(sorted(data.draw(st.sets(st.sampled_from(S.ALL_OP_KINDS), min_size=1))))
    op = data.draw(S.control_ops(kept))
    assert S.CONTROL_OP_NAMES.index(_name(op)) in kept
    placed = data.draw(S.control_ops(kept, placed=True))
    assert _name(placed) not in S.UNDOING_OP_KINDS
    if any(i in S.PLACED_OP_KINDS for i in kept):
        assert S.CONTROL_OP_NAMES.index(_name(placed)) in kept


def test_an_index_means_the_same_option_whichever_others_are_kept():
    """_pick draws an index into every option and draws again while it falls
    on one left out, so keeping more options does not change what an index
    already drawn picks."""
    def drawing(*indices):
        it = iter(indices)
        return lambda strategy: next(it)

    options = ("a", "b", "c", "d")
    assert S._pick(drawing(2), options, {0, 2}) == "c"
    assert S._pick(drawing(2), options, {0, 1, 2, 3}) == "c"
    assert S._pick(drawing(1, 3), options, {0, 3}) == "d"  # 1 left out: drawn again
    assert S._pick(drawing(*[1] * S.PICK_TRIES), options, {2, 3}) == "c"  # every try left out: the first kept


def test_a_program_keeps_about_half_the_kinds():
    kept = []

    @settings(NO_DB, max_examples=400, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def collect(data):
        kept.append(len(data.draw(st.composite(lambda draw: S._kept(draw, 20))())))

    collect()
    assert min(kept) >= 1 and max(kept) == 20
    assert 8 <= sum(kept) / len(kept) <= 12


def _control_kinds(program):
    return [_name(a.op if isinstance(a, (A.OnPhase, A.OnWindow)) else a) for a in program
            if isinstance(getattr(a, "op", a), CONTROL_TYPES)]


def test_swarm_programs_hold_fewer_kinds_than_uniform_ones(monkeypatch):
    """What swarm testing is for: a program focused on a few kinds of action
    rather than one of everything. Over 600 derandomized pp1-normal
    programs, fewer distinct action types per program than when every
    program keeps every kind (2148 against 2888 when written). On grammar
    18 (a burst, drawn twice as often, flattens into the types single
    actions have) four seeded samples gave ratios of 0.78 to 0.94, so the
    bound is 0.95; only the built-in actions count (an extension another
    test loaded would add a kind)."""
    from scripted_runtime import extensions

    monkeypatch.setattr(extensions, "actions", lambda: {})

    def count():
        kinds = 0

        @settings(NO_DB, max_examples=600, suppress_health_check=list(HealthCheck))
        @given(S.programs("pp1-normal"))
        def collect(program):
            nonlocal kinds
            kinds += len({type(a).__name__ for a in program})

        collect()
        return kinds

    swarm = count()
    monkeypatch.setattr(S, "_kept", lambda draw, n: tuple(range(n)))
    uniform = count()
    assert swarm < 0.95 * uniform, (swarm, uniform)


WINDOWS = S.windows_for("pp1-normal")


def _opened(seq):
    """A sequence without the request its opening may be posted right
    behind (grammar 15), and whether it was: the request is a plain start,
    followed at once by the opening operation."""
    if isinstance(seq[0], A.Start):
        assert not isinstance(seq[1], (A.Start, A.OnPhase, A.OnWindow)), seq
        return tuple(seq[1:]), True
    return tuple(seq), False


def _opening(action):
    """The operation a sequence opens with, and where it was placed."""
    if isinstance(action, A.OnPhase):
        if action.phase == "idle":  # grammar 18: a pause or a release once every request finished
            assert isinstance(action.op, (A.Pause, A.ReleaseMemory)), action
            return action.op, "idle"
        assert action.phase in PHASES
        return action.op, "phase"
    if isinstance(action, A.OnWindow):
        assert action.window in WINDOWS
        return action.op, "window"
    return action, "now"


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_the_sequences_open_and_close_as_clients_drive_them(data):
    kept = tuple(sorted(data.draw(st.sets(st.sampled_from(S.ALL_OP_KINDS), min_size=1))))
    start = S.starts()
    paused, _ = _opened(data.draw(S.paused(kept, PHASES, WINDOWS, 24, start)))
    first, _ = _opening(paused[0])
    # the pause, an update or a release (optional), what happens while paused, the continue
    assert isinstance(first, A.Pause) and paused[-1] == A.Continue() and len(paused) <= 3 + S.SEQUENCE_BETWEEN
    modes = {m for m in S.PAUSE_MODES if S.CONTROL_OP_NAMES.index(f"pause_{m}") in kept}
    assert not modes or first.mode in modes
    if len(paused) == 3 + S.SEQUENCE_BETWEEN:  # only with the update or the release right after the pause
        assert isinstance(paused[1], (A.UpdateWeights, A.ReleaseMemory))
    if isinstance(paused[1], A.UpdateWeights):  # placed after the pause: of a kind the program keeps
        assert S.CONTROL_OP_NAMES.index(_name(paused[1])) in kept or len(paused) <= 2 + S.SEQUENCE_BETWEEN
    for kv in (False, True):
        seq, arriving = _opened(data.draw(S.bracketed(kept, PHASES, WINDOWS, 24, start, kv)))
        opening, where = _opening(seq[0])
        assert not (arriving and where != "now")
        assert not (arriving and isinstance(opening, A.ReleaseMemory))  # the harness would skip it
        pairs = {A.ReleaseMemory: A.ResumeMemory(), A.SetLimit: A.SetLimit("default"), A.SlowDown: A.SlowDown(0),
                 A.SessionOp: A.SessionOp("close"), A.ExhaustKv: A.ReleaseKv()}
        if isinstance(opening, A.WeightQuery):
            assert (opening.kind, seq[-1]) in {("profile", A.WeightQuery("profile_stop")),
                                               ("snapshot", A.WeightQuery("compare"))}
        else:
            assert seq[-1] == pairs[type(opening)], seq
        assert kv or not isinstance(opening, A.ExhaustKv)
        assert not (isinstance(opening, A.ExhaustKv) and where == "window")  # a window places control ops only
        assert len(seq) <= 2 + S.SEQUENCE_BETWEEN
    observed = data.draw(S.observed(kept))
    assert 1 <= len(observed) <= 3
    if len(observed) == 3:
        assert all(isinstance(q, A.WeightQuery) and q.kind in S.OBSERVING_QUERIES for q in (observed[0], observed[2]))


_sequences = derandomized_draws


def test_a_pause_is_mostly_for_a_weight_update_and_only_of_a_kept_kind():
    """Half the pauses have a weight update of a kept kind right after them
    (what RL frameworks pause for); a program keeping no update kind gets
    none there."""
    start = S.starts()
    everything = tuple(range(len(S.CONTROL_OP_KINDS)))
    drawn = _sequences(S.paused(everything, PHASES, WINDOWS, 24, start))
    with_update = sum(isinstance(seq[1], A.UpdateWeights) for seq in drawn)
    assert 0.3 * len(drawn) <= with_update <= 0.8 * len(drawn), with_update
    # the smallest paused sequence has no update: a failure needing none shrinks it away
    assert find(S.paused(everything, PHASES, WINDOWS, 24, start), lambda s: True, settings=NO_DB) == \
        (A.Pause("in_place"), A.Continue())
    no_updates = tuple(i for i in everything if not S.CONTROL_OP_NAMES[i].startswith("update_"))
    for seq in _sequences(S.paused(no_updates, PHASES, WINDOWS, 24, start), 300):
        assert not any(isinstance(a, A.UpdateWeights) for a in seq), seq
    # grammar 18: a quarter have a memory release there (the RL cycle as a sequence), only of a kept kind
    with_release = sum(isinstance(seq[1], A.ReleaseMemory) for seq in drawn)
    assert 0.1 * len(drawn) <= with_release <= 0.4 * len(drawn), with_release
    no_release = tuple(i for i in everything if S.CONTROL_OP_NAMES[i] != "release_memory")
    for seq in _sequences(S.paused(no_release, PHASES, WINDOWS, 24, start), 300):
        assert not any(isinstance(a, A.ReleaseMemory) for a in seq), seq


def test_an_observed_operation_is_mostly_compared_by_one_query_before_and_after_a_weight_change():
    everything = tuple(range(len(S.CONTROL_OP_KINDS)))
    drawn = _sequences(S.observed(everything))
    both = [seq for seq in drawn if len(seq) == 3]
    same = [seq for seq in both if seq[0] == seq[2]]
    assert len(same) >= 0.5 * len(both) > 0
    changing = (A.UpdateWeights, A.RlCycle, A.ReleaseMemory)
    # the operation of a sequence with no query or both (the others' may be a query itself)
    op = [seq[len(seq) // 2] for seq in drawn if len(seq) != 2]
    assert sum(isinstance(a, changing) for a in op) >= 0.4 * len(op)
    # a checksum taken before and after an update: the shape a stale checksum needs
    assert any(seq[0] == seq[2] == A.WeightQuery("checksum") and isinstance(seq[1], A.UpdateWeights) for seq in both)
    # a program keeping no weight-changing kind observes one of the kinds it keeps
    kept = (S.CONTROL_OP_NAMES.index("flush"), S.CONTROL_OP_NAMES.index("query_checksum"))
    for seq in _sequences(S.observed(kept), 200):
        assert all(isinstance(a, (A.Flush, A.WeightQuery)) for a in seq), seq


def test_an_observed_operation_shrinks_to_the_operation_alone():
    """The queries around an observed operation are drawn as part of the
    sequence; a failure that needs only the operation must not keep them."""
    everything = tuple(range(len(S.CONTROL_OP_KINDS)))
    found = find(S.observed(everything), lambda seq: any(isinstance(a, A.Flush) for a in seq), settings=NO_DB)
    assert found == (A.Flush(),), found
    both = find(S.observed(everything), lambda seq: len(seq) == 3, settings=NO_DB)
    assert isinstance(both[0], A.WeightQuery) and isinstance(both[2], A.WeightQuery), both


def test_every_bracket_and_every_placement_is_drawn():
    start = S.starts()
    for name, _, close in S.BRACKETS:
        seq = find(S.bracketed(S.ALL_OP_KINDS, PHASES, WINDOWS, 24, start, True), lambda s: s[-1] == close,
                   settings=NO_DB)
        assert seq[-1] == close
    assert find(S.bracketed(S.ALL_OP_KINDS, PHASES, WINDOWS, 24, start, True),
                lambda s: s[-1] == A.ReleaseKv(), settings=NO_DB)[0] == A.ExhaustKv(0)
    for where in ("now", "phase", "window", "idle"):
        seq = find(S.paused(S.ALL_OP_KINDS, PHASES, WINDOWS, 24, start), lambda s: _opening(s[0])[1] == where,
                   settings=NO_DB)
        assert _opening(seq[0])[1] == where
    # what happens in between: requests too (a limit lowered with two requests arriving)
    assert find(S.bracketed(S.ALL_OP_KINDS, PHASES, WINDOWS, 24, start, False),
                lambda s: sum(isinstance(a, A.Start) for a in s) >= 2, settings=NO_DB)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(S.programs("pp1-normal"), S.action_strategy("pp1-normal"))
def test_programs_are_flat_and_bounded_and_a_mutants_action_is_one_action(program, action):
    assert 1 <= len(program) <= S.MAX_ACTIONS and isinstance(program[0], A.Start)
    assert all(not isinstance(a, tuple) for a in program)
    assert not isinstance(action, tuple)
