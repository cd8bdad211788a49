"""The prompts explored programs send: one pure function, ``prompt_ids``.

A prompt made of one repeated token hides the errors that matter here: a KV
entry of one position read for another position of the same prompt, or one
prompt's KV read for another's, gives the same logits, so the output oracle
cannot see it. So an explored prompt is a pseudo-random token sequence: a
prompt *family* is one fixed sequence, and a prompt is a family's sequence
cut to a length. Two requests of one family share the prefix of the shorter
one (a partial radix hit), the same (family, length) twice is a full hit,
and different families share nothing (their first tokens differ).

The sequence is SplitMix64 (Steele, Lea and Flood, 2014), written out here
rather than taken from Python's ``random``, whose algorithm a release could
change: a scenario file written today must send the same tokens in a year.
``tests/logic/test_explore_grammar.py`` pins the first tokens of every family.

Tokens lie in ``TOKEN_MIN..TOKEN_MAX`` (3..511): inside the CPU default's
tiny model's vocabulary (512), clear of its special ids (bos 1, eos 2), and
ordinary tokens of the GPU default's model too. It runs in the harness
process (the reference warm-up) and in the scheduler process (the program
source, written scenario files), so it imports nothing of either.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

TOKEN_MIN = 3
TOKEN_MAX = 511
FAMILIES = 3  # the explorer's families: few, so requests often share a prefix
_SPAN = TOKEN_MAX - TOKEN_MIN + 1
_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
# Each family's seed: any fixed numbers whose sequences start on different tokens.
_SEED_BASE = 0x5C21_7E4D_0A11_0001


def _splitmix64(state: int) -> "tuple[int, int]":
    """One SplitMix64 step: (the next state, the 64-bit output)."""
    state = (state + _GOLDEN) & _MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return state, z ^ (z >> 31)


def prompt_ids(family: int, length: int) -> List[int]:
    """The first ``length`` tokens of prompt family ``family`` (a new list).
    Pure and deterministic: ``prompt_ids(f, n)`` is a prefix of
    ``prompt_ids(f, m)`` for every ``n <= m``."""
    if family < 0 or length < 1:
        raise ValueError(f"prompt_ids needs family >= 0 and length >= 1, got family={family}, length={length}")
    state = (_SEED_BASE + family * 0x1000_0000_0000_0001) & _MASK
    out = []
    for _ in range(length):
        state, z = _splitmix64(state)
        out.append(TOKEN_MIN + z % _SPAN)
    return out


def family_of(ids: Sequence[int], families: int = FAMILIES) -> Optional[int]:
    """The family whose prompt of that length ``ids`` is, or None (for messages)."""
    ids = list(ids)
    if not ids:
        return None
    return next((f for f in range(families) if prompt_ids(f, len(ids)) == ids), None)


def describe(ids: Sequence[int]) -> str:
    """``"65-token prompt of family 1"``, or its first tokens when it is no family's."""
    family = family_of(ids)
    if family is not None:
        return f"{len(ids)}-token prompt of family {family}"
    head = ", ".join(str(t) for t in list(ids)[:3])
    return f"{len(ids)}-token prompt [{head}{', ...' if len(ids) > 3 else ''}]"
