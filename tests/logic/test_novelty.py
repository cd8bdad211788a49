"""Novelty guidance (``user_side/explore/novelty.py``) and the abstract-state
coverage the statistics keep (``stats.py``): the mutation, the corpus of
novel programs, the search with and without guidance on a stand-in runner,
the coverage series, the flag. No SGLang process."""
from __future__ import annotations

import time

import pytest
from hypothesis import given, settings as hsettings

from scripted_runtime.user_side.explore import actions as A, novelty as N, runner, search, strategies
from scripted_runtime.user_side.explore.explore_settings import ExploreSettings
from scripted_runtime.user_side.explore.stats import Stats

S1, S2, S3 = A.Steps(1), A.Steps(2), A.Steps(3)
NEW1, NEW2 = A.Flush(), A.AbortAll()
KEEP = N.EDIT_KINDS - 1


def test_mutate_drops_replaces_inserts_keeps_and_appends():
    base = [S1, S2, S3]
    assert N.mutate(base, [KEEP] * 4, [NEW1, NEW2], 12) == base
    assert N.mutate(base, [N.DROP, KEEP, N.DROP], [NEW1], 12) == [S2]
    assert N.mutate(base, [N.REPLACE, N.INSERT, KEEP], [NEW1, NEW2], 12) == [NEW1, NEW2, S2, S3]
    # past the base's end a replace or an insert appends; a keep or drop adds nothing
    assert N.mutate(base, [KEEP, KEEP, KEEP, N.DROP, N.INSERT], [NEW1], 12) == base + [NEW1]
    # once the fresh actions are used up, an edit that would put one in keeps
    assert N.mutate(base, [N.REPLACE, N.REPLACE, N.INSERT], [NEW1], 12) == [NEW1, S2, S3]
    # positions past the edits are kept, and the result is capped
    assert N.mutate(base, [N.DROP], [], 12) == [S2, S3]
    assert N.mutate(base, [N.INSERT, N.INSERT], [NEW1, NEW2], 3) == [NEW1, S1, NEW2]


def test_the_corpus_keeps_novel_passing_programs_until_frozen_or_full():
    nov = N.Novelty(max_actions=12, cap=2)
    assert not nov.consider([S1], new_states=0, failed=False)  # nothing new
    assert not nov.consider([S1], new_states=3, failed=True)  # new, but failing: its mutants would fail alike
    assert nov.consider([S1], new_states=1, failed=False) and nov.corpus == [[S1]]
    nov.freeze()
    assert not nov.consider([S2], new_states=5, failed=False) and nov.corpus == [[S1]]
    full = N.Novelty(max_actions=12, cap=1)
    assert full.consider([S1], new_states=1, failed=False) and not full.consider([S2], new_states=1, failed=False)


def test_a_mutant_picks_its_corpus_program_modulo_the_corpus_and_is_remembered():
    nov = N.Novelty(max_actions=12)
    empty = nov.mutant(5, [N.REPLACE, KEEP], [NEW1])  # no corpus yet: the fresh actions alone
    assert empty == [NEW1] and not nov.drawn_from_corpus(empty)
    nov.consider([S1], new_states=1, failed=False)
    nov.consider([S2, S3], new_states=1, failed=False)
    assert nov.mutant(3, [KEEP, KEEP], []) == [S2, S3] and nov.drawn_from_corpus([S2, S3])
    assert nov.mutant(4, [KEEP], []) == [S1]
    # the corpus only grows, so an index drawn once names the same program later
    nov.consider([S3], new_states=1, failed=False)
    assert nov.mutant(0, [KEEP], []) == [S1]


def test_without_novelty_the_strategy_is_the_plain_one():
    plain = strategies.programs("pp1-normal")
    assert N.guided_strategy(None, plain, strategies.action_strategy("pp1-normal")) is plain


_GUIDED = N.Novelty(max_actions=strategies.MAX_ACTIONS)
_GUIDED.consider([A.Start(8, 1, 1), A.Flush(), A.Steps(2)], new_states=1, failed=False)


@hsettings(max_examples=60, deadline=None)
@given(N.guided_strategy(_GUIDED, strategies.programs("pp4"), strategies.action_strategy("pp4")))
def test_guided_programs_are_programs_and_compile(program):
    assert len(program) <= strategies.MAX_ACTIONS
    compile(A.to_source(program).text, "<guided>", "exec")


class _StatesRunner:
    """Runs nothing: each program "reaches" one state per (position, action
    type), so longer, more varied programs reach more; fails those ``fails`` picks."""

    def __init__(self, topology, fails=lambda program: False):
        self.topology, self.fails, self.ran, self.restarts = topology, fails, [], 0
        self.info = {"sglang_version": "0.0.test"}

    def run(self, program, trace=None):
        self.ran.append(list(program))
        states = tuple(sorted({f"{i}:{type(a).__name__}" for i, a in enumerate(program)}))
        return runner.Outcome(signature="InvariantViolation[slot_ownership]" if self.fails(program) else None,
                              message="planted", steps=len(program), states=states)


@pytest.mark.parametrize("novelty", [True, False])
def test_the_search_counts_states_either_way_and_mutates_novel_programs_only_when_guided(novelty):
    fake = _StatesRunner("pp1-normal")
    result = search.search(fake, ExploreSettings(profile="ci", max_examples=150, corpus=False, known_bugs=(),
                                                 novelty=novelty))
    st = result.stats
    # 150 examples drawn; a repeat (a mutant rebuilding a program already run) is answered from memory
    assert st.novelty is novelty and st.examples == len(fake.ran) and st.examples + st.cached == 150
    assert len({tuple(p) for p in fake.ran}) == len(fake.ran)  # and never run twice
    reached = {f"{i}:{type(a).__name__}" for p in fake.ran for i, a in enumerate(p)}
    assert set(st.states) == reached and 0 < st.novel_programs < st.examples
    assert all(at >= 0 for at in st.states.values())
    assert (st.guided_programs > 0) is novelty
    assert ("novelty guidance on" if novelty else "novelty guidance off") in st.summary()


def test_a_failure_met_in_a_mutant_freezes_the_corpus_and_shrinks_like_any(monkeypatch):
    """Once a failure is met the corpus stops growing, so each choice
    sequence Hypothesis replays while shrinking is the same program; a
    mutant's failure shrinks as a plain program's does (edit 0 drops)."""
    frozen = []
    real_freeze = N.Novelty.freeze
    monkeypatch.setattr(N.Novelty, "freeze", lambda self: frozen.append(self) or real_freeze(self))

    def fails(program):
        # (two flushes: the grammar draws a flush among more than a dozen control operations; with a
        # pause as well, 6 programs in 2,000 of the swarm draw: most seeds met none in 1,000)
        return sum(isinstance(a, A.Flush) for a in program) >= 2

    met_in_a_mutant = []
    for seed in range(8):
        frozen.clear()
        fake = _StatesRunner("pp1-normal", fails)
        result = search.search(fake, ExploreSettings(profile="dev", seed=seed, max_examples=1000, corpus=False,
                                                     known_bugs=(), shrink_time_s=30))
        if result.program is None:  # none met in this seed's 1,000 programs: the next seed
            assert not frozen
            continue
        assert len(frozen) == 1
        # minimal is 2 (two flushes); shrinking is cut by its time budget on a loaded box
        assert fails(result.program) and len(result.program) <= 5, [a.describe() for a in result.program]
        if frozen[0].drawn_from_corpus(result.first_program):
            met_in_a_mutant.append(seed)
            break
    assert met_in_a_mutant, "no seed met the failure in a mutant: the guided path went untested"


def test_the_coverage_series_counts_states_by_the_minute_they_were_first_reached():
    st = Stats(topology="pp4")
    assert st.add(runner.Outcome(signature=None, states=("a", "b")), shrinking=False, at_s=10.0) == 2
    assert st.add(runner.Outcome(signature=None, states=("b", "c")), shrinking=False, at_s=70.0) == 1
    assert st.add(runner.Outcome(signature=None, states=("a",)), shrinking=False, at_s=130.0) == 0
    assert st.add(runner.Outcome(signature=None, states=("d",)), shrinking=False, at_s=175.0) == 1
    st.wall_s = 175.0
    assert st.states == {"a": 10.0, "b": 10.0, "c": 70.0, "d": 175.0} and st.novel_programs == 3
    assert st.states_by_minute() == [2, 3, 4] and st.states_reached_by(60) == 2
    assert "abstract states: 4 distinct, by minute 2, 3, 4; 3 novel programs; novelty guidance off" in st.summary()
    assert Stats().states_by_minute() == [0]
    # workers: a state counts from the first worker that reached it
    other = Stats(topology="pp4", wall_s=60.0, novelty=True, novel_programs=1, guided_programs=5,
                  states={"a": 2.0, "e": 50.0})
    st.merge(other)
    assert st.states == {"a": 2.0, "b": 10.0, "c": 70.0, "d": 175.0, "e": 50.0}
    assert (st.novelty, st.novel_programs, st.guided_programs) == (True, 4, 5)
    assert Stats.from_dict(st.as_dict()).as_dict() == st.as_dict()


def test_novelty_is_the_profiles_unless_a_flag_says_and_workers_inherit_the_flag():
    """Off for ci (a 60 s search: bench/README.md, "Without novelty
    guidance"), on for dev and nightly; --novelty / --no-novelty win, for
    explore, its workers and mutate."""
    from scripted_runtime.user_side import cli
    from scripted_runtime.user_side.explore import parallel

    parser = cli.build_parser()
    assert {name: p.novelty for name, p in search.PROFILES.items()} == {"ci": False, "dev": True, "nightly": True}
    for profile in ("ci", "dev", "nightly"):
        default = cli.explore_settings(parser.parse_args(["explore", "--profile", profile]))
        assert default.novelty is None and default.guided(search.PROFILES[profile]) is (profile != "ci")
        for flag, on in (("--novelty", True), ("--no-novelty", False)):
            args = parser.parse_args(["explore", "--profile", profile, flag, "-n", "2"])
            assert cli.explore_settings(args).guided(search.PROFILES[profile]) is on
            assert flag in parallel.explore_argv(args, workers=1)
    argv = parallel.explore_argv(parser.parse_args(["explore"]), workers=1)
    assert "--novelty" not in argv and "--no-novelty" not in argv  # a worker takes its profile's too
    assert ExploreSettings().novelty is None and ExploreSettings(novelty=True).guided(search.PROFILES["ci"])
    for argv, on in ((["mutate"], False), (["mutate", "--novelty"], True), (["mutate", "--profile", "dev"], True)):
        settings = cli.mutate_settings(parser.parse_args(argv))
        assert settings.guided(search.PROFILES[settings.profile]) is on, argv


@pytest.mark.parametrize("profile, guided", [("ci", False), ("dev", True)])
def test_the_search_follows_its_profiles_novelty_when_the_run_does_not_say(profile, guided):
    fake = _StatesRunner("pp1-normal")
    result = search.search(fake, ExploreSettings(profile=profile, seed=None if profile == "ci" else 5,
                                                 max_examples=60, corpus=False, known_bugs=()))
    assert result.stats.novelty is guided
    assert (result.stats.guided_programs > 0) is guided


class _SlowRunner(_StatesRunner):
    def run(self, program, trace=None):
        time.sleep(0.01)
        return super().run(program, trace)


@pytest.mark.parametrize("novelty", [True, False])
def test_the_time_budget_ends_the_search_whatever_the_program_count(novelty):
    """With the program count lifted (bench/novelty.py), the search time
    ends Hypothesis's run: it does not go on drawing programs that are
    answered without running (the first bench run never ended)."""
    fake = _SlowRunner("pp1-overlap")
    t0 = time.monotonic()
    result = search.search(fake, ExploreSettings(profile="dev", seed=3, max_examples=10 ** 9, max_time_s=1.0,
                                                 corpus=False, known_bugs=(), novelty=novelty))
    took = time.monotonic() - t0
    # how many run in the 1 s depends on the box's load (5 to 80 measured): the point is the end
    assert result.program is None and result.stats.examples == len(fake.ran) >= 2
    assert took < 30, f"the search ran {took:.0f}s on a 1 s budget"
    assert result.stats.skipped == 1  # the one program drawn after the budget, not run
