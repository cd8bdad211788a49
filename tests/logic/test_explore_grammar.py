"""The explorer's grammar (grammar version 2): prompts with content, drawn
request semantics (ignore_eos, a stop token), resends and KV pressure; the
source they compile to, run on a fake context; the output oracle's stop cut.
Pure logic, no server."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from scripted_runtime.scheduler_side import output_oracle as oracle, request_contract
from scripted_runtime.scheduler_side.explore import prompts
from scripted_runtime.user_side.explore import strategies
from tests.fakes import FakeScheduler


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


# --- the output oracle's stop cut ------------------------------------------------------------

EOS = 2
REF = [40, 41, 42, 43, 42, 45, 2, 47, 48, 49, 50, 51, 52, 53, 54, 55]


@pytest.mark.parametrize("kwargs, expected", [
    ({"max_new_tokens": 5, "ignore_eos": True, "stop_tokens": {42, EOS}}, REF[:5]),  # stops ignored
    ({"max_new_tokens": 5, "ignore_eos": False, "stop_tokens": {43}}, REF[:4]),  # the stop token is output
    ({"max_new_tokens": 9, "ignore_eos": False, "stop_tokens": {42}}, REF[:3]),  # the first occurrence
    ({"max_new_tokens": 9, "ignore_eos": False, "stop_tokens": {EOS}}, REF[:7]),  # EOS ends it
    ({"max_new_tokens": 4, "ignore_eos": False, "stop_tokens": {43}}, REF[:4]),  # a stop at the cap: a stop
    ({"max_new_tokens": 3, "ignore_eos": False, "stop_tokens": {45}}, REF[:3]),  # beyond the cap: length
])
def test_expected_output_cuts_the_reference_as_sglang_ends_the_request(kwargs, expected):
    assert request_contract.expected_output(REF, **kwargs) == expected
    words = oracle.cut_of(expected, **kwargs)
    stopped = not kwargs["ignore_eos"] and expected[-1] in kwargs["stop_tokens"]
    assert words == (f"at stop token {expected[-1]}" if stopped else f"max_new_tokens={kwargs['max_new_tokens']}")


def _Reason(name, **json):
    """A finish reason named as SGLang's class is, serialized as it serializes it."""
    return type(name, (), {"to_json": lambda self: dict(json)})()


def _handle(output, reason, *, max_new=8, ignore_eos=False, stops=(), finished_len=None, status="finished"):
    params = SimpleNamespace(top_k=1, max_new_tokens=max_new, ignore_eos=ignore_eos, stop_token_ids=set(stops))
    req = SimpleNamespace(origin_input_ids=prompts.prompt_ids(0, 8), sampling_params=params, eos_token_ids={EOS},
                          output_ids=list(output), finished_len=finished_len, finished_reason=reason)
    return SimpleNamespace(rid="r1", status=status, last_req=req, finish_reason=type(reason).__name__,
                           output_ids=list(output), posted_step=0)


def _check(monkeypatch, *handles):
    monkeypatch.setattr(oracle, "_references", {(None, tuple(prompts.prompt_ids(0, 8))): list(REF)})
    ctx = SimpleNamespace(scheduler=FakeScheduler(), control_ops=[])
    gen = oracle.check_outputs(ctx, list(handles))
    with pytest.raises(StopIteration) as stop:
        next(gen)  # every reference is cached: no step
    return stop.value.value


def test_a_stop_finished_request_is_compared_with_its_reference_cut_at_the_stop(monkeypatch):
    stopped = _handle(REF[:4], _Reason("FINISH_MATCHED_TOKEN", type="stop", matched=43), stops={43}, finished_len=4)
    on_eos = _handle(REF[:7], _Reason("FINISH_MATCHED_TOKEN", type="stop", matched=EOS), max_new=9, finished_len=7)
    ignored = _handle(REF[:8], _Reason("FINISH_LENGTH", type="length", length=8), ignore_eos=True, stops={43},
                      finished_len=8)
    assert _check(monkeypatch, stopped, on_eos, ignored) == 3


def test_a_request_that_ran_past_its_stop_token_is_a_mismatch(monkeypatch):
    past = _handle(REF[:6], _Reason("FINISH_LENGTH", type="length", length=6), max_new=6, stops={43},
                   finished_len=6)
    with pytest.raises(oracle.OutputMismatch, match=r"8-token prompt of family 0, finished\): finished with 6 "
                                                    r"tokens, its reference ends after 4 \(at stop token 43\)"):
        _check(monkeypatch, past)


def test_an_aborted_request_is_a_prefix_of_its_cut_reference(monkeypatch):
    reason = _Reason("FINISH_ABORT", type="abort")
    assert _check(monkeypatch, _handle(REF[:3], reason, stops={43}, status="aborted")) == 1
    with pytest.raises(oracle.OutputMismatch, match="past the end of its reference after 4"):
        _check(monkeypatch, _handle(REF[:5], reason, stops={43}, status="aborted"))
