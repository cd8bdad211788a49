"""The Hypothesis search over programs (harness process).

Design: each example is a whole program (a list of actions, drawn by
``strategies.programs``) that runs as one script on the live server, instead
of a ``RuleBasedStateMachine`` whose rules would each be a harness <->
scheduler round trip. Hypothesis shrinks the list the same way it shrinks a
state machine's rule sequence (drop actions, simplify each one), and the
state machine's preconditions become run-time guards in the program
(``abort_one`` with nothing live does nothing, a start while paused is held
back), so a shrunk program never needs a precondition it cannot meet.

Runs are memoized by program, so Hypothesis's final replay of the shrunk
example answers from memory (no Flaky from a nondeterministic build; the
determinism check replays for real). The time budget is enforced by answering
programs that arrive after it as passing without running them, and, while no
failure was met, by ending Hypothesis's run at the first program drawn after
it (``_SearchTimeSpent``): with a lifted program count Hypothesis would
otherwise go on drawing programs that are answered without running.

With novelty on (``settings.guided``: the dev and nightly profiles' default) the search is guided by novelty
(``novelty.py``): a program that reaches an abstract scheduler state no
program reached before joins a corpus, and half the programs drawn are
mutants of a corpus program. Without it the states are still counted (the
coverage figure, ``Stats.states``), so the two can be compared.
"""
from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from hypothesis import HealthCheck, Phase, Verbosity, example, given, settings
from hypothesis import seed as hypothesis_seed

from scripted_runtime import known_bugs as known_bugs_mod
from scripted_runtime.scheduler_side import request_fuzz
from scripted_runtime.user_side.server_config import ServerConfig
from scripted_runtime.user_side.explore import corpus as corpus_mod, failure_db, novelty as novelty_mod, strategies
from scripted_runtime.user_side.explore.explore_settings import ExploreSettings
from scripted_runtime.user_side.explore.runner import ExampleRunner, Outcome
from scripted_runtime.user_side.explore.stats import Stats


def fuzz_cases_for(settings: Any, registry: Sequence[Any], *, topology: str,
                   version: Optional[str]) -> Optional[Tuple[str, ...]]:
    """The field cases request fuzzing draws (``settings.fuzz_requests``), or
    None with it off: every case but those meeting a registered bug that
    kills the server on ``topology`` and ``version`` (unless
    ``settings.fuzz_known_crashes``)."""
    if not settings.fuzz_requests:
        return None
    if settings.fuzz_known_crashes:
        return request_fuzz.drawable_cases(())
    breaking = [b.name for b in registry if b.breaks_server and b.applies(topology, version)]
    return request_fuzz.drawable_cases(breaking)


class _SearchTimeSpent(BaseException):
    """Ends Hypothesis's run when the search time is spent (a BaseException
    that is none of ``hypothesis.core.failure_exceptions_to_catch``: it
    propagates as a KeyboardInterrupt does, not as a failing example)."""


@dataclass(frozen=True)
class Profile:
    max_examples: int
    max_time_s: float  # for finding (server start excluded)
    shrink_time_s: float  # for shrinking a failure once found
    derandomize: bool
    progress_every_s: float
    # Novelty guidance on unless the run says otherwise (ExploreSettings.novelty). Off for ci: in
    # a 60 s search, drawing half the programs as edits of kept ones cost more kills than it found
    # (bench/README.md, "Without novelty guidance"); on for the long runs, where it reaches more
    # abstract states (bench/novelty.py).
    novelty: bool = True
    # (topology, factor): a topology whose programs run so much slower than pp=1's that the same
    # time would search it far less deeply gets ``max_time_s`` times the factor (``search_time_s``)
    time_scale: Tuple[Tuple[str, float], ...] = ()

    def search_time_s(self, topology: Optional[str] = None, given: Optional[float] = None) -> float:
        """The search time on ``topology``: ``given`` (a run's ``--max-time``)
        where it is not None, taken as it is; else ``max_time_s``, scaled
        where ``time_scale`` names the topology."""
        if given is not None:
            return given
        return self.max_time_s * dict(self.time_scale).get(topology or "", 1.0)


# The ci profile's search at pp=4 runs three times as long as at pp=1. There an iteration is one
# micro-batch slot of ~5.7 ms on the 2-core box (SGLang's own PP loop, the harness's share lost in
# its noise: bench/README.md, compare.py) and a request takes a round of six slots per token, so a
# program runs ~90 iterations against ~30 at pp=1, and a 60-s search ~90 programs against ~450.
# Three times 60 s gives a pp4 row ~250-270 programs, the depth of a pp1-overlap row (260-450).
# Chosen knowing that the pp4 survivors of the 60-s kill table are killed at pp=1 by programs 26
# to 222, so a figure at this budget is tuned (bench/README.md, "Without the seed corpus, pp4").
CI_TIME_SCALE = (("pp4", 3.0),)

PROFILES: Dict[str, Profile] = {
    # CI: the same program sequence every run, bounded in time (on the 2-core box a pp=1 search
    # runs ~450 programs in the 60 s; pp=4, given 180 s, ~260) and in examples.
    "ci": Profile(max_examples=1000, max_time_s=60, shrink_time_s=90, derandomize=True, progress_every_s=15,
                  novelty=False, time_scale=CI_TIME_SCALE),
    "dev": Profile(max_examples=1000, max_time_s=600, shrink_time_s=180, derandomize=False, progress_every_s=30),
    "nightly": Profile(max_examples=20000, max_time_s=3 * 3600, shrink_time_s=900, derandomize=False,
                       progress_every_s=60),
}


def hypothesis_settings(profile: Profile, max_examples: int) -> settings:
    return settings(
        max_examples=max_examples, derandomize=profile.derandomize, database=None, deadline=None,
        suppress_health_check=list(HealthCheck), report_multiple_bugs=False, print_blob=False,
        verbosity=Verbosity.quiet, phases=(Phase.explicit, Phase.generate, Phase.shrink),
    )


for _name, _profile in PROFILES.items():
    settings.register_profile(f"scripted-runtime-{_name}", hypothesis_settings(_profile, _profile.max_examples))


class ProgramFailed(AssertionError):
    """Raised inside the Hypothesis test for a failing program; one subclass
    per failure signature, so Hypothesis shrinks each failure as its own bug."""

    signature = ""


_failure_classes: Dict[str, type] = {}


def failure_class(signature: str) -> type:
    cls = _failure_classes.get(signature)
    if cls is None:
        cls = type(f"ProgramFailed_{len(_failure_classes)}", (ProgramFailed,), {"signature": signature})
        _failure_classes[signature] = cls
    return cls


@dataclass
class Finding:
    """A failure signature met by the search: its first program, as found
    (before any shrinking), known bugs included."""

    signature: str
    program: list
    outcome: Outcome
    position: int  # programs run by then (this one included)
    known: str = ""  # the registered SGLang bug it is, if any
    # the file ``SearchEvents.met`` kept it in (a later program of the same signature if keeping
    # the first failed: every one is offered until one is kept)
    kept: Optional[str] = None


class SearchEvents:
    """What the caller does *during* the search, at three moments; the
    defaults do nothing. Everything else comes back in ``SearchResult``.

    These cannot wait for the search to return: ``met`` writes the first
    program of each failure the moment it is met, so no failure is lost
    whatever happens to the search after (a kill while shrinking, a full
    disk later); ``found`` starts what the failure will need soon (the
    standby server for its fresh replay) while it is shrunk; and ``alone``
    decides whether it is shrunk at all."""

    def met(self, finding: Finding) -> Optional[str]:
        """The first program of a failure signature (``finding``): keep it;
        the path written, or None (offered again with the next program of
        that signature). An OSError is reported and the search goes on."""
        return None

    def found(self, finding: Finding) -> None:
        """Once, the first new (not known) failure, before its shrinking."""

    def alone(self, finding: Finding) -> Optional[bool]:
        """Then: whether that program fails the same way alone on a fresh
        server (None: not checked). False ends the search unshrunk
        (``SearchResult.needs_history``): shrinking it on a server whose
        state it needs would shrink the wrong thing."""
        return None


@dataclass
class SearchResult:
    stats: Stats
    program: Optional[list] = None  # the shrunk failing program
    outcome: Optional[Outcome] = None
    seed: Optional[int] = None
    first_program: Optional[list] = None  # the failing program as first found
    first_outcome: Optional[Outcome] = None  # its outcome (which server, after what: runner.history_before)
    found_after_examples: Optional[int] = None
    longest_passing: Optional[list] = None  # for the determinism check when nothing failed
    # known SGLang bug name -> (the first program that hit it, its outcome, programs run by then)
    known: Dict[str, Tuple[list, Outcome, int]] = field(default_factory=dict)
    # every failure signature met, in the order met (``Finding``)
    failures: List[Finding] = field(default_factory=list)
    # the first failing program passed alone on a fresh server (``SearchEvents.alone``): it needs what
    # its server ran before it, so it was not shrunk here (``history.recover`` does that)
    needs_history: bool = False

    @property
    def kept(self) -> Dict[str, str]:
        """Failure signature -> the file its first program was kept in."""
        return {f.signature: f.kept for f in self.failures if f.kept}


def search(runner: ExampleRunner, settings: ExploreSettings, *, store: Optional[failure_db.FailureStore] = None,
           events: Optional[SearchEvents] = None,
           progress: Callable[[str], None] = lambda line: None) -> SearchResult:
    """Search until a new failure (shrunk, returned) or the budget is spent
    (``settings``: the profile and its overrides, the seed, the corpus, the
    known bugs, the stop file). A failure that is a registered SGLang bug
    (``settings.known_bugs``; ``()`` treats every failure as new) is
    counted as ``known: NAME`` and the search goes on, unless
    ``stop_at_known``. Every failure signature met is in ``result.failures``.

    ``corpus``: run the seed corpus (``corpus.py``) first, outside the time
    budget (it is a fixed, bounded set) and the example count.

    ``events``: what the caller does during the search (``SearchEvents``:
    keep each failure's first program at once, act on the first new
    failure, say whether it needs its server's history).

    ``store``: the failure database (``failure_db``): its programs run
    first (before the corpus, outside the budget); one that passes now is
    deleted from it, and the first program of every new failure is saved
    (the explorer saves the shrunk one too)."""
    events = events or SearchEvents()
    profile = PROFILES[settings.profile]
    seed, known_bugs, stop_at_known, stop_file = (settings.seed, settings.registry(), settings.stop_at_known,
                                                  settings.stop_file)
    topology = runner.topology
    guided = settings.guided(profile)
    stats = Stats(topology=topology, device=getattr(runner, "device", "cpu"), novelty=guided)
    novelty = novelty_mod.Novelty(max_actions=strategies.MAX_ACTIONS) if guided else None
    limit_examples = settings.max_examples or profile.max_examples
    limit_s = settings.search_time_s(profile, topology)
    shrink_s = profile.shrink_time_s if settings.shrink_time_s is None else settings.shrink_time_s
    if not profile.derandomize and seed is None:
        seed = random.randrange(2**31)
    memo: Dict[Tuple, Outcome] = {}
    last_failing: Dict[str, Tuple[list, Outcome]] = {}
    first: Dict[str, object] = {}
    longest: List[object] = [None, -1]
    met_known: Dict[str, Tuple[list, Outcome, int]] = {}
    findings: Dict[str, Finding] = {}
    saved: set = set()  # failure signatures whose first program went to the failure database
    other_signatures: set = set()  # failures met while shrinking the first: kept, not shrunk

    def meet(current: Finding) -> None:
        """Record ``current`` if its signature is new; offer it to be kept
        until one program of its signature is."""
        finding = findings.setdefault(current.signature, current)
        if finding.kept:
            return
        try:
            path = events.met(current)
        except OSError as exc:  # a full disk must not end the search; say it loudly
            progress(f"could NOT keep the failing program ({current.signature}): {exc}")
            return
        if path:
            finding.kept = path
            progress(f"kept: program {current.position} of the run ({current.signature}) -> {path}")
    version = str(runner.info.get("sglang_version") or "") or None
    t0 = time.monotonic()
    last_note = [t0]

    features = runner.features() if hasattr(runner, "features") else ServerConfig(topology).features()
    seeds = corpus_mod.programs(topology, features) if settings.corpus else []
    stored = store.programs() if store is not None else []
    stored_keys = {tuple(program) for program in stored}
    if stored:
        progress(f"failure database: {len(stored)} stored failing programs first")
    seeds = [("stored", program) for program in stored] + [s for s in seeds if tuple(s[1]) not in stored_keys]
    seed_keys = {tuple(program) for _, program in seeds}
    generation_started: List[float] = []  # when the first program not of the corpus came up

    def search_elapsed(now: float) -> float:
        """Seconds of the search's own budget spent: counted from the first
        program that is not a stored or corpus one (the corpus runs outside
        the budget, however long it takes: at pp=4 it alone is ~70 s)."""
        if not generation_started:
            generation_started.append(now)
        return now - generation_started[0]

    def budget_left(key: Tuple) -> bool:
        now = time.monotonic()
        if first.get("needs_history"):
            return False
        if "at" in first:
            return now - first["at"] < shrink_s
        if stop_file and os.path.exists(stop_file):
            return False
        return key in seed_keys or search_elapsed(now) < limit_s

    def search_time_spent(key: Tuple) -> bool:
        """The search's own budget is spent, no failure is being shrunk or
        replayed, and ``key`` is not a stored or corpus program."""
        return ("at" not in first and not first.get("needs_history") and key not in seed_keys
                and search_elapsed(time.monotonic()) >= limit_s)

    def note(force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - last_note[0] < profile.progress_every_s:
            return
        last_note[0] = now
        stats.wall_s = now - t0
        phase = f"shrinking {first['signature']}" if "at" in first else "searching"
        progress(f"{phase}: {stats.examples} programs ({stats.per_minute:.0f}/min), {stats.steps} steps, "
                 f"{sum(stats.failures.values())} failing, {stats.wall_s:.0f}s")

    fuzz_cases = fuzz_cases_for(settings, known_bugs, topology=topology, version=version)
    if fuzz_cases is not None:
        left_out = [c.name for c in request_fuzz.CASES if c.name not in fuzz_cases]
        progress(f"request fuzzing: drawing from {len(fuzz_cases)} field cases"
                 + (f"; left out (a known bug that kills the server here): {', '.join(left_out)}" if left_out else ""))

    @given(novelty_mod.guided_strategy(novelty, strategies.programs(topology, features=features, fuzz_cases=fuzz_cases),
                                       strategies.action_strategy(topology, features, fuzz_cases)))
    def explored(program):
        key = tuple(program)
        outcome = memo.get(key)
        if outcome is None:
            if not budget_left(key):
                stats.skipped += 1
                if search_time_spent(key):
                    raise _SearchTimeSpent()
                return
            ran_at = time.monotonic()
            outcome = runner.run(program)
            memo[key] = outcome
            bug = known_bugs_mod.find(outcome.signature, topology=topology, sglang_version=version,
                                      message=outcome.message, ops=outcome.ops, registry=known_bugs,
                                      own_failure=outcome.own_failure) \
                if outcome.failed and not stop_at_known else None
            new_states = stats.add(outcome, shrinking="at" in first, known=bug.name if bug else "",
                                   at_s=time.monotonic() - t0)
            if novelty is not None:
                stats.guided_programs += 1 if novelty.drawn_from_corpus(program) else 0
                novelty.consider(program, new_states=new_states, failed=outcome.failed)
            current = Finding(signature=outcome.signature, program=list(program), outcome=outcome,
                              position=stats.examples, known=bug.name if bug else "") if outcome.failed else None
            if current is not None:
                meet(current)
            if store is not None and key in stored_keys and not outcome.failed:
                store.delete(program)
                progress("a stored failing program passes now: removed from the failure database")
            elif store is not None and outcome.failed and bug is None and outcome.signature not in saved:
                saved.add(outcome.signature)
                store.save(program)
            if bug is not None:
                if bug.name not in met_known:
                    met_known[bug.name] = (list(program), outcome, stats.examples)
                    progress(f"known: {bug.name} ({outcome.signature}) after {stats.examples} programs; "
                             "searching on for others")
                note()
                return
            stats.restarts = runner.restarts
            if not outcome.failed and outcome.steps > longest[1]:
                longest[:] = [list(program), outcome.steps]
            if outcome.failed and "at" not in first:
                first.update(at=time.monotonic(), signature=outcome.signature, program=list(program),
                             examples=stats.examples, outcome=outcome)
                if novelty is not None:
                    novelty.freeze()  # shrinking must replay each choice sequence as the same program
                stats.first_failure_s = ran_at + outcome.wall_s - t0
                if stop_file:
                    open(stop_file, "a").close()
                progress(f"FOUND {outcome.signature} after {stats.examples} programs in "
                         f"{stats.first_failure_s:.1f}s; shrinking (up to {shrink_s:.0f}s)")
                events.found(current)
                if events.alone(current) is False:
                    first["needs_history"] = True
                    progress("it passes alone on a fresh server: it needs what its server ran before it, so "
                             "it is not shrunk here (the history is replayed and shrunk instead)")
            note()
        else:
            # A repeat (a mutant can rebuild a program already run) is answered from memory and
            # counted as cached, never rejected: Hypothesis replays a choice sequence it met as
            # valid, and an example valid once and invalid on replay is a FlakyFailure (met by
            # bench/novelty.py at the end of a 90 s budget).
            stats.cached += 1
            if outcome.failed and not stop_at_known and known_bugs_mod.find(
                    outcome.signature, topology=topology, sglang_version=version, message=outcome.message,
                    ops=outcome.ops, registry=known_bugs, own_failure=outcome.own_failure):
                return
        if outcome.failed and outcome.signature != first.get("signature"):
            # Another failure met while shrinking the first: kept as found (``meet``), not shrunk.
            # Raised, Hypothesis would report whichever is smallest by its own order, and the
            # written file, its history replay and the report would no longer be the failure found.
            if outcome.signature not in other_signatures:
                other_signatures.add(outcome.signature)
                progress(f"shrinking met another failure, {outcome.signature}: kept as found, not shrunk")
            return
        if outcome.failed:
            last_failing[outcome.signature] = (list(program), outcome)
            raise failure_class(outcome.signature)(outcome.message)

    for _, program in reversed(seeds):  # decorators apply inside out: the corpus runs in its listed order
        explored = example(program)(explored)
    if len(seeds) > len(stored):
        progress(f"seed corpus first: {len(seeds) - len(stored)} programs (every control operation in every "
                 "request phase)")
    explored = hypothesis_settings(profile, limit_examples)(explored)
    if seed is not None:
        explored = hypothesis_seed(seed)(explored)
    result = SearchResult(stats=stats, seed=seed, known=met_known)
    try:
        explored()
    except _SearchTimeSpent:
        pass  # the budget ended the search with nothing failing: as Hypothesis's own end
    except ProgramFailed as exc:
        program, outcome = last_failing[exc.signature]
        result.program, result.outcome = program, outcome
        result.first_program = first.get("program")
        result.first_outcome = first.get("outcome")
        result.needs_history = bool(first.get("needs_history"))
        result.found_after_examples = first.get("examples")

    stats.wall_s = time.monotonic() - t0
    result.longest_passing = longest[0]
    result.failures = list(findings.values())
    note(force=True)
    return result
