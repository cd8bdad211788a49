"""The explorer's grammar (grammar version 2): prompts with content, drawn
request semantics (ignore_eos, a stop token), resends and KV pressure; the
source they compile to, run on a fake context; the output oracle's stop cut.
Pure logic, no server."""
from __future__ import annotations

import pytest

from scripted_runtime.scheduler_side.explore import prompts
from scripted_runtime.user_side.explore import strategies


# --- the prompt generator -----------------------------------------------------------

def test_prompt_ids_are_pinned():
    """The tokens a written scenario file sends: changing them changes every stored program."""
    assert prompts.prompt_ids(0, 8) == [31, 479, 164, 302, 411, 71, 130, 256]
    assert prompts.prompt_ids(1, 8) == [375, 390, 311, 204, 358, 285, 504, 130]
    assert prompts.prompt_ids(2, 8) == [476, 67, 433, 12, 135, 490, 17, 228]


def test_a_shorter_prompt_is_a_prefix_of_a_longer_one_of_its_family_only():
    longest = {f: prompts.prompt_ids(f, 300) for f in range(prompts.FAMILIES)}
    for f in range(prompts.FAMILIES):
        for n in strategies.PROMPT_LENGTHS:
            assert prompts.prompt_ids(f, n) == longest[f][:n]
    firsts = [longest[f][0] for f in range(prompts.FAMILIES)]
    assert len(set(firsts)) == len(firsts), "two families would share a prefix"


def test_prompt_tokens_avoid_the_special_ids_and_stay_in_the_vocabulary():
    tokens = [t for f in range(prompts.FAMILIES) for t in prompts.prompt_ids(f, 4096)]
    assert min(tokens) >= prompts.TOKEN_MIN == 3 and max(tokens) <= prompts.TOKEN_MAX == 511
    assert len(set(tokens)) > 400, "the range is used, not a few values"
    with pytest.raises(ValueError):
        prompts.prompt_ids(0, 0)
    with pytest.raises(ValueError):
        prompts.prompt_ids(-1, 4)


def test_a_prompt_is_described_by_its_family():
    assert prompts.describe(prompts.prompt_ids(1, 65)) == "65-token prompt of family 1"
    assert prompts.describe([1, 1, 1, 1]) == "4-token prompt [1, 1, 1, ...]"
    assert prompts.family_of([]) is None
