"""The explorer's grammar (grammar version 2): prompts with content, drawn
request semantics (ignore_eos, a stop token), resends and KV pressure; the
source they compile to, run on a fake context; the output oracle's stop cut.
Pure logic, no server."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from scripted_runtime.scheduler_side import output_oracle as oracle, request_contract
from scripted_runtime.scheduler_side.explore import program as explore_helpers, prompts
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


# --- the program helpers (scheduler side), on a fake context ------------------------------

class _FakeCtx:
    """What a program's source calls on ``ctx``, recorded; every request
    finishes at once (the end-state checks are stubbed)."""

    def __init__(self):
        self.scheduler = FakeScheduler(idle=True)
        self.control_ops, self.calls, self.held = [], [], 0
        self.pending_flushes = 0  # iterations until a posted flush is processed

    def unprocessed_ops(self, name):
        return ["op"] if name == "flush_cache" and self.pending_flushes else []

    def check_enabled(self, name):
        return True

    def start_req(self, **kwargs):
        self.calls.append(("start_req", kwargs))
        return SimpleNamespace(finished=True, status="finished")

    def steps(self, n):
        for _ in range(n):
            yield
            self.iterated()

    def iterated(self):
        self.pending_flushes = max(0, self.pending_flushes - 1)

    def pause_generation(self, mode):
        self.control_ops.append(SimpleNamespace(name=f"pause_generation({mode})"))

    def continue_generation(self):
        self.control_ops.append(SimpleNamespace(name="continue_generation"))

    def exhaust_kv(self, *, leave_pages):
        self.calls.append(("exhaust_kv", leave_pages))
        self.held = 100
        return 100

    @property
    def exhausted_kv_tokens(self):
        return self.held

    def release_exhausted_kv(self):
        self.calls.append(("release_exhausted_kv", self.held))
        held, self.held = self.held, 0
        return held


def _run(source_text, ctx):
    namespace = {}
    exec(compile(source_text, "<program>", "exec"), namespace)
    gen = namespace["program"](ctx)
    steps = 0
    try:
        while True:
            next(gen)
            steps += 1
    except StopIteration as stop:
        return stop.value, steps


def test_without_references_a_stop_is_the_fixed_id(monkeypatch):
    """The oracle off (or a device it does not compare on): no reference is
    computed, every stop is ``FALLBACK_STOP_ID``."""
    ctx = _FakeCtx()
    ctx.check_enabled = lambda name: name != "greedy_output"
    gen = explore_helpers.stop_tokens(ctx, [(0, 8, 5), (2, 64, 0)])
    with pytest.raises(StopIteration) as stop:
        next(gen)
    fixed = explore_helpers.FALLBACK_STOP_ID
    assert stop.value.value == {(0, 8, 5): fixed, (2, 64, 0): fixed}


def test_a_flush_gives_back_the_exhausted_kv_first():
    """An accepted flush clears SGLang's allocator: held slots would be freed twice."""
    ctx = _FakeCtx()
    ctx.flush_cache = lambda: ctx.calls.append(("flush_cache", ctx.held)) or "op"
    ctx.exhaust_kv(leave_pages=0)
    gen = explore_helpers.flush_cache(ctx)
    with pytest.raises(StopIteration):
        next(gen)
    assert ctx.calls[-2:] == [("release_exhausted_kv", 100), ("flush_cache", 0)]


def test_kv_is_not_taken_while_a_flush_is_in_flight():
    """A flush processed after the slots were taken would clear them: the
    action steps until it was processed, or takes nothing."""
    ctx = _FakeCtx()
    ctx.pending_flushes = 2
    gen = explore_helpers.exhaust_kv(ctx, 4)
    next(gen)
    ctx.iterated()
    assert ctx.calls == []
    next(gen)
    ctx.iterated()
    with pytest.raises(StopIteration) as stop:
        next(gen)
    assert stop.value.value == 100 and ctx.calls == [("exhaust_kv", 4)]
    stuck = _FakeCtx()
    stuck.pending_flushes = 10 ** 6  # never processed (the tokenizer dropped it)
    gen = explore_helpers.exhaust_kv(stuck, 4)
    assert sum(1 for _ in _drain(gen)) == 4 and stuck.calls == []


def _drain(gen):
    while True:
        try:
            yield next(gen)
        except StopIteration:
            return


def test_release_exhausted_kv_gives_everything_back_now():
    from tests.logic.test_collaborators import _allocating, _wired
    from tests.fakes import TOTAL

    s = _allocating(FakeScheduler(idle=True))
    ctx, _, _, kv_holds, _ = _wired(s)
    assert ctx.release_exhausted_kv() == 0
    taken = ctx.exhaust_kv(leave_pages=10)
    assert ctx.release_exhausted_kv() == taken == TOTAL - 10
    assert not kv_holds.holding and len(s.token_to_kv_pool_allocator.free_pages) == TOTAL
