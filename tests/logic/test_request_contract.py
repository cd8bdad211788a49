"""The request-semantics contract's rule (scheduler_side/request_contract.py),
on answers as SGLang 0.5.23's /generate writes them (pure)."""
from __future__ import annotations

import pytest

from scripted_runtime.scheduler_side import check_registry, invariants, request_contract
from scripted_runtime.user_side import mutate

EOS = 2


def answer(out, kind, **extra):
    return {"output_ids": out, "meta_info": {"finish_reason": {"type": kind, **extra}}}


def judge(body, *, max_new=4, ignore_eos=False, stops=(EOS,)):
    return request_contract.violation(body, max_new_tokens=max_new, ignore_eos=ignore_eos, stop_tokens=stops)


@pytest.mark.parametrize("body, kwargs", [
    (answer([5, 6, 7, 8], "length", length=4), {}),
    (answer([5, 6, EOS], "stop", matched=EOS), {}),
    (answer([5, 9], "stop", matched=9), {"stops": (EOS, 9)}),
    (answer([5, EOS, 6, EOS], "length", length=4), {"ignore_eos": True}),  # ignore_eos: EOS is a token
    (answer([5], "abort", message="aborted"), {}),
    (answer([], "abort"), {}),
    (answer([5, 6, 7, EOS], "stop", matched=EOS), {}),  # a stop at the cap is a stop
    (answer([5, 6], "stop", matched="</s>"), {}),  # a stop string: not judged without the tokenizer
])
def test_answers_that_keep_the_contract(body, kwargs):
    assert judge(body, **kwargs) is None


@pytest.mark.parametrize("body, kwargs, words", [
    (answer([5, 6, 7, 8, 9], "length", length=4), {}, "5 tokens for max_new_tokens=4"),
    (answer([5, 6, 7], "length", length=4), {}, "finish reason length with 3 of max_new_tokens=4"),
    (answer([5, EOS, 6], "stop", matched=EOS), {}, "emitted after it"),
    (answer([5, EOS, 6, 7], "length", length=4), {}, "emitted after it"),
    (answer([5, 6, 7, EOS], "length", length=4), {}, "is a stop token, yet the finish reason is length"),
    (answer([5, 6], "stop", matched=6), {}, "no stop token"),
    (answer([5, EOS], "stop", matched=EOS), {"ignore_eos": True}, "under ignore_eos"),
    (answer([5, 9, 6], "stop", matched=9), {"stops": (EOS, 9)}, "emitted after it"),
    (answer([5, 6], "stop", matched=EOS), {}, "the last token is 6"),
    (answer([5], None), {}, "none of length, stop, abort"),
])
def test_answers_that_break_it(body, kwargs, words):
    problem = judge(body, **kwargs)
    assert problem is not None and words in problem, problem


def test_it_is_an_end_check_of_the_one_registry_named_for_the_kill_table():
    assert request_contract.NAME in invariants.END_CHECK_NAMES
    assert check_registry.kind_of(request_contract.NAME) == "InvariantViolation"  # not a per-iteration contract
    assert mutate.caught_by("RequestContractError: request r1: finish reason length with 3 of ...") == \
        "request contract"


def _handle(**req_fields):
    from types import SimpleNamespace

    params = SimpleNamespace(max_new_tokens=4, ignore_eos=False, stop_token_ids={9})
    return SimpleNamespace(last_req=SimpleNamespace(sampling_params=params, eos_token_ids={EOS}, **req_fields))


def test_the_stop_tokens_are_those_sglang_matches_and_a_grammar_is_not_judged():
    assert request_contract.params_of(_handle()) == (4, False, {9, EOS})
    from types import SimpleNamespace

    tok = SimpleNamespace(eos_token_id=7, additional_stop_token_ids=[11])
    assert request_contract.params_of(_handle(tokenizer=tok)) == (4, False, {9, EOS, 7, 11})
    assert request_contract.params_of(_handle(grammar=object())) is None


def test_the_answer_is_read_off_the_ended_request_as_sglang_serializes_it():
    from types import SimpleNamespace

    class FINISH_LENGTH:
        def to_json(self):
            return {"type": "length", "length": 3}

    req = SimpleNamespace(output_ids=[5, 6, 7, 8], finished_len=3, finished_reason=FINISH_LENGTH())
    assert request_contract.answer_of(req) == answer([5, 6, 7], "length", length=3)
    assert request_contract.answer_of(SimpleNamespace(output_ids=[5], finished_reason=None)) is None


# --- usage: meta_info.cached_tokens --------------------------------------------------------

def _ended(cached, *, stained=False):
    from types import SimpleNamespace

    return SimpleNamespace(cached_tokens=cached, retracted_stain=stained)


@pytest.mark.parametrize("cached, first, stained, words", [
    (0, 0, False, None),  # a cold prompt, one chunk or three
    (64, 64, False, None),  # a prefix hit of one chunk
    (128, 0, False, "cached_tokens=128, but its first extend started from a prefix-cache hit of 0 tokens"),
    (100, 36, False, "prefix-cache hit of 36 tokens"),  # its own earlier chunk counted as a hit
    (128, 0, True, None),  # retracted: SGLang stops counting, nothing to judge
    (5, None, False, None),  # never ran an extend (aborted while waiting)
])
def test_cached_tokens_is_the_prefix_cache_hit_of_the_first_extend(cached, first, stained, words):
    problem = request_contract.cached_tokens_violation(_ended(cached, stained=stained), first)
    assert (problem is None) if words is None else (words in problem), problem


def test_an_answer_with_wrong_cached_tokens_breaks_the_contract():
    from types import SimpleNamespace

    class FINISH_LENGTH:
        def to_json(self):
            return {"type": "length", "length": 2}

    params = SimpleNamespace(max_new_tokens=2, ignore_eos=True, stop_token_ids=())
    req = SimpleNamespace(output_ids=[5, 6], finished_len=None, finished_reason=FINISH_LENGTH(), sampling_params=params,
                          eos_token_ids=(), cached_tokens=128, retracted_stain=False)
    handle = SimpleNamespace(rid="r7", status="finished", last_req=req, first_prefix_len=0)
    with pytest.raises(request_contract.RequestContractError, match="request r7: cached_tokens=128"):
        request_contract.check_answers([handle])
    handle.first_prefix_len = 128
    assert request_contract.check_answers([handle]) == 1


def test_the_tracker_keeps_the_prefix_of_each_requests_first_extend_only():
    from types import SimpleNamespace

    from scripted_runtime.scheduler_side.request_tracker import RequestTracker

    a, b = SimpleNamespace(rid="a"), SimpleNamespace(rid="b")
    tracker = RequestTracker()
    tracker.on_batch([a], [0])  # a's first chunk, cold
    tracker.on_batch([a, b], [64, 36])  # a's second chunk starts at 64 (its own work); b hits 36
    tracker.on_batch([a, b])  # a decode forward: no prefix
    assert tracker.first_prefix == {"a": 0, "b": 36}
    tracker.clear()
    assert tracker.first_prefix == {}


def test_the_tracker_keeps_every_extends_end_per_req_object():
    from types import SimpleNamespace

    from scripted_runtime.scheduler_side.request_tracker import RequestTracker

    a, b, again = SimpleNamespace(rid="a"), SimpleNamespace(rid="b"), SimpleNamespace(rid="a")
    tracker = RequestTracker()
    tracker.on_batch([a], [0], [64])  # a's first chunk
    tracker.on_batch([b, a], [0, 64], [8, 56])  # b and a share the 64-token budget: a's chunk ends at 120
    tracker.on_batch([a, b])  # a decode forward: no extend
    tracker.on_batch([again], [120], [72])  # a reused rid is another Req: its ends are its own
    assert tracker.extend_ends == {id(a): [64, 120], id(b): [8], id(again): [192]}
    tracker.clear()
    assert tracker.extend_ends == {}
