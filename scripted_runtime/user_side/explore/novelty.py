"""Novelty guidance for the search (harness process): programs that drove
the scheduler into an abstract state no program reached before
(``scheduler_side/abstract_state.py``) are kept in a corpus, and the search
draws half its programs as mutants of a corpus program, so shapes that are
one edit away from new ground get tried without anyone writing them down.

Why not Hypothesis's own tools (docs/exploring.md, "Novelty guidance", says
more): ``hypothesis.target`` hill-climbs the best-scoring example per label
against the score it got when it ran, which a "new states" score no longer
gives it (the states are old by then), and it only runs in the ``target``
phase after half the example budget; the example database replays (it does
not mutate) saved choice sequences, which a change of the grammar turns into
other programs; HypoFuzz guides by Python branch coverage of the process the
test runs in, here the harness, while the scheduler runs in the server.

A mutant is drawn with a fixed shape whatever the corpus holds: an index
(into the corpus, modulo its length), an edit per program position and
``NEW_ACTIONS`` fresh actions for the edits that put one in. So the same
choices are always the same draws (Hypothesis requires it), and, the
corpus being append-only and frozen once a failure is found, the same
program while that failure is shrunk. Edit 0 drops the corpus program's
action at that position, so shrinking a mutant towards zeros shrinks it
like a list: actions drop out.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Set

from hypothesis import strategies as st

# The corpus index is drawn from this fixed range and taken modulo the
# corpus's length: a range that depended on the length would change the
# draws' shape as the corpus grows (a flaky strategy to Hypothesis).
INDEX_RANGE = 1 << 16
CORPUS_CAP = 2000  # novel programs kept; past it the corpus stops growing (states are still counted)
# An edit per position, as an integer 0..EDIT_KINDS-1: the first ones edit, the rest keep.
DROP, REPLACE, INSERT = 0, 1, 2
EDIT_KINDS = 10  # so 70% of positions keep the corpus program's action
# Fresh actions a mutant draws for its replaces and inserts (in order; once used up, an edit that
# would put one in keeps instead). A few, not one per position: every draw costs generation time.
NEW_ACTIONS = 3


def mutate(base: Sequence, kinds: Sequence[int], new: Sequence, max_actions: int) -> list:
    """``base`` with one edit per position (``kinds``): drop its action,
    replace it with the next of the ``new`` actions, insert that one before
    it, or keep it; past ``base``'s end a replace or an insert appends the
    next new action. Positions past ``kinds`` are kept; at most
    ``max_actions``."""
    out: list = []
    fresh = iter(new)
    for i, kind in enumerate(kinds):
        action = next(fresh, None) if kind in (REPLACE, INSERT) else None
        if i < len(base):
            if kind == DROP:
                continue
            if action is not None and kind == INSERT:
                out.append(action)
            out.append(action if action is not None and kind == REPLACE else base[i])
        elif action is not None:
            out.append(action)
    out += list(base[len(kinds):])
    return out[:max_actions]


class Novelty:
    """The corpus of novel programs and the strategy that mutates them.
    Which states are new is the statistics' business (``Stats.add``
    counts them); this keeps what to do about it."""

    def __init__(self, *, max_actions: int, cap: int = CORPUS_CAP) -> None:
        self.max_actions = max_actions
        self.cap = cap
        self.corpus: List[list] = []  # append-only: an index drawn once means the same program later
        self.frozen = False
        self._mutants: Set[tuple] = set()  # programs the strategy built from the corpus

    def consider(self, program: Sequence, *, new_states: int, failed: bool) -> bool:
        """Keep ``program`` if it reached ``new_states`` > 0 states never seen
        before and passed (a failing one would have its mutants meet the
        same failure over and over); returns whether it was kept."""
        if new_states <= 0 or failed or self.frozen or len(self.corpus) >= self.cap:
            return False
        self.corpus.append(list(program))
        return True

    def freeze(self) -> None:
        """No more additions: from the first failure on, so that shrinking
        replays each choice sequence as the same program."""
        self.frozen = True

    def drawn_from_corpus(self, program: Sequence) -> bool:
        """Whether the strategy built ``program`` as a mutant of a corpus program."""
        return tuple(program) in self._mutants

    def mutant(self, index: int, kinds: Sequence[int], new: Sequence) -> list:
        """Corpus program ``index`` (modulo the corpus) mutated (``mutate``);
        while the corpus is empty, the ``new`` actions the edits put in."""
        if not self.corpus:
            return mutate([], kinds, new, self.max_actions)
        program = mutate(self.corpus[index % len(self.corpus)], kinds, new, self.max_actions)
        self._mutants.add(tuple(program))
        return program

    def strategy(self, programs: st.SearchStrategy, action: st.SearchStrategy) -> st.SearchStrategy:
        """Fresh ``programs`` first (Hypothesis shrinks towards the first
        alternative), or a corpus program mutated with ``action``s."""
        kinds = st.lists(st.integers(0, EDIT_KINDS - 1), min_size=self.max_actions, max_size=self.max_actions)
        new = st.lists(action, min_size=NEW_ACTIONS, max_size=NEW_ACTIONS)
        return st.one_of(programs, st.builds(self.mutant, st.integers(0, INDEX_RANGE - 1), kinds, new))


def guided_strategy(novelty: Optional[Novelty], programs: st.SearchStrategy,
                    action: st.SearchStrategy) -> st.SearchStrategy:
    """The search's strategy: ``programs`` as they are without guidance."""
    return programs if novelty is None else novelty.strategy(programs, action)
