"""The explorer's grammar (grammar version 2): prompts with content, drawn
request semantics (ignore_eos, a stop token), resends and KV pressure; the
source they compile to, run on a fake context; the output oracle's stop cut.
Pure logic, no server."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, find, given, settings

from scripted_runtime.scheduler_side import output_oracle as oracle, request_contract
from scripted_runtime.scheduler_side.explore import program as explore_helpers, prompts
from scripted_runtime.user_side.explore import actions as A, corpus, failure_db, runner, strategies
from scripted_runtime.user_side.server_config import ServerConfig
from tests.fakes import FakeScheduler
from tests.helpers import derandomized_draws

# derandomized: find() then draws the same examples every run (no flaky "no example found")
NO_DB = settings(database=None, max_examples=2000, derandomize=True)


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
                           output_ids=list(output), posted_step=0, extend_ends=[8])


def _check(monkeypatch, *handles):
    monkeypatch.setattr(oracle, "_references", {(None, tuple(prompts.prompt_ids(0, 8))): (list(REF), len(REF))})
    ctx = SimpleNamespace(scheduler=FakeScheduler(), control_ops=[], batch_log=[])
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


def test_a_session_turn_is_compared_with_its_history_unless_sglang_refused_it_with_another_prompt(monkeypatch):
    """A turn is judged against the client's history (``expected_prompt``);
    one SGLang aborted with another prompt (refused at ingest: a closed
    session, the turn it continues unfinished; it runs a placeholder) is
    judged by the prompt SGLang ran, as any such abort."""
    history = prompts.prompt_ids(1, 8)  # the client's history; SGLang's record (the handle's req) is family 0's
    other = [t + 1 for t in REF]

    def turn(output, reason, status):
        h = _handle(output, reason, status=status)
        h.expected_prompt, h.session = list(history), "s1"
        return h

    monkeypatch.setattr(oracle, "_references", {(None, tuple(prompts.prompt_ids(0, 8))): (list(REF), len(REF)),
                                                (None, tuple(history)): (other, len(other))})
    ctx = SimpleNamespace(scheduler=FakeScheduler(), control_ops=[], batch_log=[])

    def check(*handles):
        with pytest.raises(StopIteration) as stop:
            next(oracle.check_outputs(ctx, list(handles)))
        return stop.value.value

    length, abort = _Reason("FINISH_LENGTH", type="length", length=8), _Reason("FINISH_ABORT", type="abort")
    assert check(turn(other[:8], length, "finished")) == 1
    with pytest.raises(oracle.OutputMismatch, match="a turn of session 's1': its history as the client's"):
        check(turn(REF[:8], length, "finished"))  # SGLang served another prompt: the history bug shape
    assert check(turn(REF[:1], abort, "aborted")) == 1  # refused with its placeholder prompt: judged by it
    aborted_mid_run = turn(REF[:2], abort, "aborted")
    aborted_mid_run.last_req.origin_input_ids = list(history)  # SGLang ran the history, then an abort came
    with pytest.raises(oracle.OutputMismatch, match="a turn of session 's1'"):
        check(aborted_mid_run)


# --- the program helpers (scheduler side), on a fake context ------------------------------

class _FakeCtx:
    """What a program's source calls on ``ctx``, recorded; every request
    finishes at once (the end-state checks are stubbed)."""

    def __init__(self):
        self.scheduler = FakeScheduler(idle=True)
        self.control_ops, self.calls, self.held = [], [], 0
        self.pending_flushes = 0  # iterations until a posted flush is processed
        self.sglang_held = 0  # KV tokens SGLang's requests and tree hold
        self.active = []  # the live requests SGLang holds

    released_memory = ()  # nothing released (release_memory_occupation)

    def list_active_reqs(self):
        return list(self.active)

    def evict_cache(self):
        self.calls.append(("evict_cache",))
        evicted, self.sglang_held = self.sglang_held, 0  # the fake's tree holds all of SGLang's KV
        return evicted

    def engine_stats(self):
        return {"kv_pool_total": 8192, "kv_pool_free": 8192 - self.sglang_held - self.held}

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
    # 4 drawn pages (no request held: no room needed; page size 1 here)
    assert stop.value.value == 100 and ctx.calls == [("exhaust_kv", 4)]
    stuck = _FakeCtx()
    stuck.pending_flushes = 10 ** 6  # never processed (the tokenizer dropped it)
    gen = explore_helpers.exhaust_kv(stuck, 4)
    assert sum(1 for _ in _drain(gen)) == 4 and stuck.calls == []


def _req(prompt, max_new, allocated=0, generated=0):
    return SimpleNamespace(origin_input_ids=[1] * prompt, sampling_params=SimpleNamespace(max_new_tokens=max_new),
                           kv_allocated_len=allocated, output_ids=[7] * generated)


@pytest.mark.parametrize("requests, left", [
    ([], 4),  # nothing admitted: SGLang's admission judges every later request
    ([(150, 12, 100, 0)], 4 + 50 + 12),  # a chunked 150-token prompt, 100 tokens in: the rest of it and its 12 new
    ([(150, 12, 100, 0), (8, 12, 10, 2)], 4 + 50 + 12),  # the most new tokens one request may still decode
    ([(150, 12, 151, 1)] * 3, 4 + 11),  # three decoding: a retraction gives the others' KV back
    # the pp1-normal finding: a 65-token request about to finish and a 192-token one whose first
    # chunk ran; the old rule (largest request less everything SGLang held: 196 - 136) left 60 and
    # the next chunk could not be allocated ("Out of memory" in alloc_for_extend)
    ([(65, 8, 72, 7), (192, 4, 64, 0)], 4 + 128 + 4),
    ([(8, 12, 10, 2), (192, 12, 0, 0, "waiting")], 4 + 10),  # a waiting request is admission's to judge
])
def test_kv_is_taken_down_to_the_room_sglang_reserved_for_what_it_admitted(requests, left):
    """SGLang must be able to finish what it admitted: every prompt token an
    admitted request has still to extend (a prefill in progress cannot be
    retracted) plus the most new tokens one request may still decode
    (``retract_decode`` frees the others) stay free beyond the drawn pages."""
    ctx = _FakeCtx()
    ctx.active = [_req(*r[:4]) for r in requests]
    ctx.scheduler.waiting_queue = [req for req, r in zip(ctx.active, requests) if r[4:] == ("waiting",)]
    list(_drain(explore_helpers.exhaust_kv(ctx, 4)))
    assert ctx.calls == [("exhaust_kv", left)]


def test_exhaust_kv_may_evict_the_radix_cache_first_and_take_it_too():
    ctx = _FakeCtx()
    ctx.active, ctx.sglang_held = [_req(8, 12, 8, 0)], 500
    list(_drain(explore_helpers.exhaust_kv(ctx, 0, evict_cache=True)))
    # evicted first, then room for the one request's 12 new tokens
    assert ctx.calls == [("evict_cache",), ("exhaust_kv", 12)]
    source = A.to_source([A.Start(8, 0, 4), A.ExhaustKv(0, evict_cache=True), A.ExhaustKv(4)]).text
    assert "yield from explore.exhaust_kv(ctx, 0, evict_cache=True)\n" in source
    assert "yield from explore.exhaust_kv(ctx, 4)\n" in source
    assert "the radix cache evicted first" in A.ExhaustKv(0, evict_cache=True).describe()


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


# --- the actions and their source -----------------------------------------------------

def test_resend_resolves_to_an_earlier_prompt_or_that_prompt_longer():
    program = [A.Start(100, 1, 4), A.Steps(1), A.Resend(0, 0, 2), A.Resend(1, 2, 2), A.Resend(5, 9, 1)]
    assert A.resolve_prompts(program) == [(1, 100), None, (1, 100), (1, 128), (1, 192)]
    # pick counts the requests started so far (modulo), Resends included; the ladder's top stays
    assert A.resolve_prompts([A.Resend(0, 1, 1)]) == [None]
    assert A.resolve_prompts([A.Start(192, 2, 1), A.Resend(0, 3, 1)]) == [(2, 192), (2, 192)]
    lines = A.describe_program(program)
    assert lines[2] == "resend action 1's prompt as it was: 100 tokens of family 1 (2 chunks), 2 new"
    # request 2 (action 3) resent its prompt: a Resend is an earlier request like any other
    assert lines[3].startswith("resend action 3's prompt 2 lengths longer: 128 tokens of family 1")
    assert A.describe_program([A.Resend(0, 1, 2)]) == [
        "resend earlier request #0's prompt 1 length longer, 2 new: no earlier request, nothing"]


def test_the_source_names_prompts_by_family_and_resolves_stops_before_the_first_action():
    program = [A.Start(100, 1, 4, ignore_eos=False, stop_at=3), A.Pause("retract"), A.Resend(0, 1, 5, stop_at=0),
               A.ExhaustKv(4), A.Resend(1, 0, 3), A.ReleaseKv(), A.Continue(), A.Resend(0, 0, 2, stop_at=3)]
    source = A.to_source(program)
    text = source.text
    compile(text, "<program>", "exec")
    lines = text.splitlines()
    prologue = [l for l in lines if "explore.stop_tokens" in l]
    assert prologue == ["    stops = yield from explore.stop_tokens(ctx, [(1, 100, 3), (1, 127, 0)])"]
    assert lines.index(prologue[0]) < source.action_lines[0][0] - 1, "resolved before the first action"
    first = "\n".join(lines[source.action_lines[0][0] - 1:source.action_lines[0][1]])
    assert ("ctx.start_req(input_ids=explore.prompt_ids(1, 100), max_new_tokens=4, ignore_eos=False, "
            "stop_token_ids=[stops[1, 100, 3]], temperature=0.0)") in first
    resent = "\n".join(lines[source.action_lines[2][0] - 1:source.action_lines[2][1]])
    assert "if explore.can_start(ctx):" in resent and "explore.prompt_ids(1, 127)" in resent
    assert "yield from explore.exhaust_kv(ctx, 4)" in text and "explore.release_kv(ctx)" in text
    assert "stops" not in A.to_source([A.Start(8, 0, 1)]).text, "no prologue without a stop token"


def test_the_generated_source_sends_the_prompts_and_stop_tokens_it_names(monkeypatch):
    def ended(ctx, reqs):
        return {"requests": len(reqs)}
        yield

    monkeypatch.setattr(explore_helpers, "end_state_checks", ended)
    ref_100 = [9, 8, 7, 6, 5, 4, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3]
    monkeypatch.setattr(oracle, "_references", {(None, tuple(prompts.prompt_ids(1, 100))): (ref_100, len(ref_100))})
    program = [A.Start(100, 1, 4, ignore_eos=False, stop_at=3), A.Steps(2), A.ExhaustKv(0),
               A.Resend(0, 0, 2, stream=True), A.ReleaseKv()]
    ctx = _FakeCtx()
    value, steps = _run(A.to_source(program).text, ctx)
    assert value == {"requests": 2} and steps == 2  # the cached reference cost no step
    (_, first), exhaust, (_, second), release = ctx.calls
    assert first == {"input_ids": prompts.prompt_ids(1, 100), "max_new_tokens": 4, "ignore_eos": False,
                     "stop_token_ids": [6], "temperature": 0.0}  # token 3 of its reference
    assert second["input_ids"] == prompts.prompt_ids(1, 100) and "stop_token_ids" not in second
    assert "stream" not in first and second["stream"] is True
    assert exhaust == ("exhaust_kv", 0) and release == ("release_exhausted_kv", 100)  # the fake holds no request


# --- the strategies ---------------------------------------------------------------------

def test_every_new_field_is_drawn_and_shrinks_to_the_plain_request():
    plain = find(strategies.starts(), lambda a: True, settings=NO_DB)
    assert plain == A.Start(8, 0, 1, ignore_eos=True, stop_at=None)
    assert find(strategies.starts(), lambda a: not a.ignore_eos, settings=NO_DB) == A.Start(8, 0, 1, False, None)
    assert find(strategies.starts(), lambda a: a.stop_at is not None, settings=NO_DB) == A.Start(8, 0, 1, True, 0)
    assert find(strategies.starts(), lambda a: a.family == 2, settings=NO_DB).family == 2
    assert find(strategies.starts(), lambda a: a.stream, settings=NO_DB) == A.Start(8, 0, 1, True, None, stream=True)
    assert find(strategies.resends(), lambda a: a.stream, settings=NO_DB).stream
    assert find(strategies.starts(), lambda a: a.stop_at == strategies.MAX_NEW_TOKENS - 1, settings=NO_DB)


@pytest.mark.parametrize("topology", ["pp1-overlap", "pp1-normal", "pp1-hicache", "pp4"])
def test_resends_and_kv_pressure_are_drawn_on_every_topology(topology):
    """Under PP too: the harness's KV operations reach every rank (scheduler_side/rank_ops.py)."""
    draw = strategies.action_strategy(topology)
    assert find(draw, lambda a: isinstance(a, A.Resend) and a.longer > 0, settings=NO_DB) == A.Resend(0, 1, 1)
    assert find(draw, lambda a: isinstance(a, A.ExhaustKv), settings=NO_DB) == A.ExhaustKv(0)
    assert find(draw, lambda a: isinstance(a, A.ExhaustKv) and a.leave_pages == 200, settings=NO_DB)
    assert find(draw, lambda a: isinstance(a, A.ReleaseKv), settings=NO_DB) == A.ReleaseKv()


def test_requests_of_very_different_lengths_together_still_shrink():
    """A failure that needs a 1-token and a 192-token request together shrinks
    to two or three plain requests (a Resend may stand for the long one: it
    depends on the request it resends, so Hypothesis need not find the pair
    of Starts). With the swarm draw, four at most: this test's derandomized
    draws shrink to four plain starts, six other seeds' to two or three
    (a program's leave-out draws come first, and each one the shrinker
    changes is a program run)."""
    program = find(strategies.programs("pp1-normal"),
                   lambda p: {n for _, n in filter(None, A.resolve_prompts(p))} >= {1, 192},
                   settings=settings(NO_DB, max_examples=6000))
    assert 2 <= len(program) <= 4 and all(isinstance(a, (A.Start, A.Resend)) for a in program)
    assert all(a.max_new_tokens == 1 and a.ignore_eos and a.stop_at is None for a in program)
    assert {f for f, _ in filter(None, A.resolve_prompts(program))} == {0}


@settings(max_examples=60, deadline=None)
@given(strategies.programs("pp1-normal"))
def test_every_prompt_a_program_sends_is_warmed(program):
    """The warm-up computes every reference a program needs, so no program
    computes one (and each runs the same steps whatever ran before it)."""
    warmed = {(f, n) for f in strategies.PROMPT_FAMILIES for n in A.PROMPT_LENGTHS}
    assert set(filter(None, A.resolve_prompts(program))) <= warmed
    compile(A.to_source(program).text, "<program>", "exec")


def test_the_warm_up_sends_every_family_at_every_length():
    class Server:
        def run(self, target, *args, **kwargs):
            self.target, self.args = target, args
            return "ran"

    server = Server()
    assert runner.ExampleRunner(ServerConfig("pp1-normal"), server=server)._warm_on(server) == "ran"
    sent, new_tokens, with_update, lora_prompts = server.args
    assert server.target == runner.WARM_REFERENCES and new_tokens == strategies.MAX_NEW_TOKENS and with_update
    assert sorted(map(tuple, sent)) == sorted(tuple(prompts.prompt_ids(f, n)) for f in range(3)
                                              for n in A.PROMPT_LENGTHS)
    assert lora_prompts == [], "no LoRA: no adapter references"
    assert strategies.MAX_NEW_TOKENS - 1 < oracle.REFERENCE_TOKENS, "a stop index beyond the references"
    # a LoRA topology: each adapter's references of every prompt a request with one can draw
    runner.ExampleRunner(ServerConfig("pp1-lora"), server=server)._warm_on(server)
    lora_prompts = server.args[3]
    assert sorted(map(tuple, lora_prompts)) == sorted(tuple(prompts.prompt_ids(f, n)) for f in range(3)
                                                      for n in A.LORA_PROMPT_LENGTHS)
    assert set(A.LORA_PROMPT_LENGTHS) <= set(A.PROMPT_LENGTHS)


def test_lora_actions_are_drawn_only_on_a_lora_topology_and_render_their_adapter():
    """Grammar 8: Start.lora and LoraOp only where LoRA is on; a request
    with an adapter loads it first (ensure_lora); the adapters are the
    harness's (user_side/models/lora_adapters.py)."""
    from hypothesis import HealthCheck, given, settings

    from scripted_runtime.user_side.models import lora_adapters

    assert A.LORA_ADAPTERS == tuple(lora_adapters.ADAPTERS)
    drawn = {"plain": set(), "lora": set()}

    @settings(max_examples=150, derandomize=True, suppress_health_check=list(HealthCheck), database=None)
    @given(plain=strategies.programs("pp1-overlap"), lora=strategies.programs("pp1-lora"))
    def draw(plain, lora):
        for key, program in (("plain", plain), ("lora", lora)):
            for a in program:
                inner = a.op if isinstance(a, (A.OnPhase, A.OnWindow)) else a
                if isinstance(inner, A.LoraOp) or getattr(inner, "lora", None):
                    drawn[key].add(type(inner).__name__)

    draw()
    assert drawn["plain"] == set() and drawn["lora"] == {"Start", "LoraOp"}
    source = A.to_source([A.Start(8, 0, 3, lora="lora1"), A.LoraOp("unload", "lora1")]).text
    assert "if (yield from explore.ensure_lora(ctx, 'lora1')):" in source
    assert "lora='lora1'" in source and "explore.lora_op(ctx, 'unload', 'lora1')" in source
    names = [n for n, _ in corpus.programs("pp1-lora", ("lora",))]
    assert "lora_third_waits+pause_retract" in names and "decoding+lora_unload_in_use" in names
    assert not any("lora" in n for n, _ in corpus.programs("pp1-overlap"))


# --- stored programs and the corpus ----------------------------------------------------------

def test_new_actions_round_trip_through_the_failure_database():
    program = [A.Start(64, 2, 3, ignore_eos=False, stop_at=4, stream=True), A.Resend(1, 2, 3, stream=True),
               A.ExhaustKv(64, evict_cache=True), A.ReleaseKv(), A.OnPhase("decode", A.AbortOne(1), 24),
               A.OnPhase("queued", A.ExhaustKv(0, evict_cache=True), 24),
               A.FuzzRequest(("top_p_zero", "rid_reused"), 1, 63, 3), A.AbortUnknown(),
               A.Pause("abort"), A.ReleaseMemory("kv_cache"), A.ResumeMemory(), A.RlCycle("in_place", "all", 3),
               A.OnPhase("decode", A.RlCycle("abort", "weights", 1), 24), A.OnWindow("x", A.ReleaseMemory("all"), 24),
               A.SetLimit("above"), A.SlowDown(1), A.WeightQuery("checksum"),
               A.OnPhase("decode", A.SetLimit("1"), 24), A.OnWindow("x", A.WeightQuery("version"), 24),
               A.Start(65, 1, 4, lora="lora2"), A.LoraOp("unload", "lora0"),
               A.OnPhase("decode", A.LoraOp("load", "lora1"), 24), A.Start(8, 0, 4, beside=1),
               A.UpdateWeights(True, distributed=True), A.OnPhase("decode", A.RlCycle("retract", "all", 1, True), 24),
               A.Start(8, 1, 4, priority=20), A.Start(8, 2, 4, priority=None), A.UpdateWeights(False, missing=True)]
    assert failure_db.decode(failure_db.encode(program)) == program
    assert A.GRAMMAR_VERSION == 18  # grammar 18 changed sequences' steps: stored choice sequences decode differently


@pytest.mark.parametrize("sequence", ["paused", "bracketed"])
def test_a_sequence_may_open_right_behind_a_new_request_so_that_both_arrive_in_one_batch(sequence):
    """Grammar 15: the opening operation posted right behind a request,
    nothing stepped between (SGLang receives both in one batch); never
    first, so a failure without the request shrinks to the plain
    opening."""
    start = strategies.starts()
    if sequence == "paused":
        draw = strategies.paused(strategies.ALL_OP_KINDS, ("decode",), ("w",), 24, start)
    else:
        draw = strategies.bracketed(strategies.ALL_OP_KINDS, ("decode",), ("w",), 24, start, True)
    plain = find(draw, lambda seq: True, settings=NO_DB)
    assert not isinstance(plain[0], A.Start)
    arriving = find(draw, lambda seq: isinstance(seq[0], A.Start) and not isinstance(seq[1], A.Start),
                    settings=NO_DB)
    assert arriving[0] == A.Start(8, 0, 1) and arriving[1] == plain[0]
    source = A.to_source([*arriving]).text
    posted = source.index("ctx.start_req(")
    assert "yield" not in source[posted:source.index("\n    # 2.", posted)]
    compile(source, "<program>", "exec")


def test_a_start_beside_a_live_request_is_drawn_under_pp_only_and_waits_for_its_slot():
    from hypothesis import given, settings as h_settings

    from scripted_runtime.user_side.explore import strategies

    seen = {"pp4": set(), "pp1-overlap": set()}
    for topology in seen:
        @h_settings(max_examples=500, database=None, derandomize=True)
        @given(strategies.programs(topology))
        def draw(program):
            seen[topology].update(a.beside for a in program if isinstance(a, A.Start))

        draw()
    assert seen["pp1-overlap"] == {None}  # one running batch at pp=1: the pp1 draws are as before
    assert {None, 0, 1, 2} <= seen["pp4"]
    text = A.to_source([A.Start(8, 0, 12), A.Steps(3), A.Start(8, 1, 4, beside=0)]).text
    compile(text, "<program>", "exec")
    assert "yield from explore.join_batch_of(ctx, reqs, 0)\n    reqs.append(ctx.start_req(" in text
    assert "in the micro-batch of live request #0" in text


def test_the_rl_grammar_compiles_to_its_helpers_and_holds_requests_back_while_memory_is_released():
    source = A.to_source([A.Start(8, 0, 4), A.ReleaseMemory("weights"), A.Start(8, 1, 4), A.Pause("abort"),
                          A.Continue(), A.OnPhase("queued", A.RlCycle("retract", "kv_cache", 1), 24),
                          A.ResumeMemory()]).text
    compile(source, "<program>", "exec")
    assert "yield from explore.release_memory(ctx, 'weights')" in source
    assert "    if explore.can_start(ctx):\n        reqs.append(ctx.start_req(input_ids=explore.prompt_ids(1, 8)" in source
    assert "yield from explore.pause(ctx, reqs, 'abort')" in source
    assert "yield from explore.continue_generation(ctx, reqs)" in source
    assert "yield from explore.rl_cycle(ctx, reqs, pause_mode='retract', tags='kv_cache', gap=1)" in source
    assert "yield from explore.resume_memory(ctx, reqs)" in source
    # the first request is sent before anything could hold it back: no guard
    assert "    reqs.append(ctx.start_req(input_ids=explore.prompt_ids(0, 8)" in source


def test_the_corpus_keeps_its_meaning_with_families():
    """Token 1, 2, 3 prompts became families 0, 1, 2: distinct prefixes where
    they were distinct, a shared one in ``prefix_hit``; plain requests."""
    phases = corpus.phases("pp1-normal")
    starts = {name: [a for a in prefix if isinstance(a, A.Start)] for name, prefix in phases.items()}
    assert all(a.ignore_eos and a.stop_at is None for group in starts.values() for a in group)
    assert [a.family for a in starts["queued"] + starts["mid_chunk"]] == [0, 1]
    short, long = starts["prefix_hit"]
    assert short.family == long.family and short.prompt_len < long.prompt_len
    assert prompts.prompt_ids(long.family, long.prompt_len)[:short.prompt_len] == \
        prompts.prompt_ids(short.family, short.prompt_len)
    hicache = corpus.hicache_phases("pp1-hicache")
    assert [a.family for a in hicache["load_held"] if isinstance(a, A.Start)] == [0, 1, 2, 0]
    for name, program in corpus.programs("pp1-hicache", ("hicache",)):
        compile(A.to_source(program).text, name, "exec")


# --- OnPhase: an operation once a scheduler phase holds ------------------------------------

@pytest.mark.parametrize("topology", ["pp1-overlap", "pp1-normal", "pp4"])
def test_an_operation_waiting_for_a_phase_is_drawn_and_shrinks_to_a_flush_while_decoding(topology):
    draw = strategies.action_strategy(topology)
    assert find(draw, lambda a: isinstance(a, A.OnPhase), settings=NO_DB) == \
        A.OnPhase("decode", A.Flush(), strategies.WINDOW_WAIT_STEPS[topology])
    assert find(draw, lambda a: isinstance(a, A.OnPhase) and a.phase == "finished_unpruned", settings=NO_DB)
    assert find(draw, lambda a: isinstance(a, A.OnPhase) and isinstance(a.op, A.AbortOne), settings=NO_DB)


def test_pp_in_flight_is_a_phase_target_under_pp_only_and_kv_pressure_on_every_topology():
    pp, normal = strategies.action_strategy("pp4"), strategies.action_strategy("pp1-normal")
    assert find(pp, lambda a: isinstance(a, A.OnPhase) and a.phase == "pp_in_flight", settings=NO_DB)
    for draw, topology in ((normal, "pp1-normal"), (pp, "pp4")):
        assert find(draw, lambda a: isinstance(a, A.OnPhase) and isinstance(a.op, A.ExhaustKv), settings=NO_DB) == \
            A.OnPhase("decode", A.ExhaustKv(0), strategies.WINDOW_WAIT_STEPS[topology])
    many = settings(max_examples=400, database=None)
    for draw, wanted in ((normal, lambda a: a.phase == "pp_in_flight"), (normal, lambda a: isinstance(a.op, A.Continue))):
        with pytest.raises(Exception):
            find(draw, lambda a: isinstance(a, A.OnPhase) and wanted(a), settings=many)


def test_an_operation_waiting_for_a_phase_compiles_to_a_bounded_wait():
    source = A.to_source([A.Start(8, 0, 4), A.OnPhase("decode", A.AbortOne(1), 24),
                          A.OnPhase("queued", A.ExhaustKv(0, evict_cache=True), 24)]).text
    assert ("    if (yield from explore.wait_for_phase(ctx, 'decode', max_steps=24)):\n"
            "        explore.abort_one(ctx, reqs, 1)\n") in source
    assert ("    if (yield from explore.wait_for_phase(ctx, 'queued', max_steps=24)):\n"
            "        yield from explore.exhaust_kv(ctx, 0, evict_cache=True)\n") in source
    assert "when the scheduler is in phase decode (within 24 steps): abort one live request" in source
    compile(source, "<program>", "exec")


def test_wait_for_phase_steps_until_the_phase_holds_or_gives_up(monkeypatch):
    seen = iter([["idle"], ["queued"], ["prefill_chunk"], ["decode"]])
    monkeypatch.setattr(explore_helpers.phases, "phases_of", lambda s, tokenizer_paused=False: next(seen))
    ctx = _FakeCtx()
    gen = explore_helpers.wait_for_phase(ctx, "decode", max_steps=10)
    steps = list(_drain(gen))
    assert len(steps) == 3  # three iterations stepped, then the phase held
    monkeypatch.setattr(explore_helpers.phases, "phases_of", lambda s, tokenizer_paused=False: ["idle"])
    gen = explore_helpers.wait_for_phase(ctx, "decode", max_steps=5)
    assert sum(1 for _ in _drain(gen)) == 5
    with pytest.raises(ValueError, match="unknown phase 'decoding'"):
        next(explore_helpers.wait_for_phase(ctx, "decoding", max_steps=5))


def test_idle_waits_for_the_requests_posted_to_be_taken_in(monkeypatch):
    """A request posted and not received yet is held nowhere: ``idle`` holds
    only once it is taken in (and then gone), or a burst's pressure would be
    taken with the program's first request arriving beside it."""
    monkeypatch.setattr(explore_helpers.phases, "phases_of", lambda s, tokenizer_paused=False: ["idle"])
    ctx = _FakeCtx()
    arriving = iter([True, True, False])
    type(ctx).requests_arriving = property(lambda self: next(arriving))
    try:
        assert sum(1 for _ in _drain(explore_helpers.wait_for_phase(ctx, "idle", max_steps=10))) == 2
    finally:
        del type(ctx).requests_arriving


def test_a_weight_update_behind_a_lost_request_fails_at_once_not_on_a_clock():
    """A request the scheduler took in and dropped without an answer holds a
    weight update in the tokenizer forever: the helper says "lost" before
    posting (deterministic), instead of timing out on the update's arrival."""
    ctx = _FakeCtx()
    ctx.describe = lambda: "idle"
    ctx.update_weights_from_disk = lambda **kw: ctx.calls.append(("update", kw))
    lost = SimpleNamespace(rid="r1", finished=False, status="lost")
    for paused in (False, True):
        ctx.control_ops = [SimpleNamespace(name="pause_generation")] if paused else []
        with pytest.raises(explore_helpers.EndStateError, match="requests lost: r1"):
            list(_drain(explore_helpers.update_weights(ctx, [lost], flush_cache=False)))
    running = SimpleNamespace(rid="r2", finished=False, status="running")
    ctx.control_ops = []
    gen = explore_helpers.update_weights(ctx, [running], flush_cache=False)
    next(gen)
    running.status = "lost"  # dropped while the helper waited for it to finish
    with pytest.raises(explore_helpers.EndStateError, match="requests lost: r2"):
        next(gen)
    assert not [c for c in ctx.calls if c[0] == "update"]


def test_a_weight_update_behind_an_unanswered_request_fails_as_the_answer_check_would(monkeypatch):
    """The tokenizer holds a weight update until every generate request it
    sent is answered: a request the scheduler ended whose answer never comes
    is named before the update is posted (a clock wait, no step)."""
    from scripted_runtime.scheduler_side import answer_delivery

    monkeypatch.setattr(answer_delivery, "ANSWER_TIMEOUT_S", 0.05)
    ctx = _FakeCtx()
    ctx.describe = lambda: "idle"
    ctx.update_weights_from_disk = lambda **kw: ctx.calls.append(("update", kw))
    silent = SimpleNamespace(rid="r3", finished=True, status="finished", last_req=None,
                             http=SimpleNamespace(wait=lambda timeout: False))
    with pytest.raises(answer_delivery.AnswerDeliveryError,
                       match="request r3 ended finished .* no /generate answer arrived within 0s of the weight update"):
        list(_drain(explore_helpers.update_weights(ctx, [silent], flush_cache=False)))
    assert not [c for c in ctx.calls if c[0] == "update"]


# --- session turns (grammar 13) ---------------------------------------------------------------

class _SessionCtx:
    """What ``program.session_turn`` calls on ``ctx``: opens answered at
    once (refused when ``refuse``), requests recorded as handles."""

    def __init__(self, refuse=False):
        self.scheduler = FakeScheduler(idle=True)
        self.control_ops, self.sent, self.refuse = [], [], refuse

    def unsettled_ops_of_type(self, request_type):
        return []

    def open_session(self, session_id):
        refuse = self.refuse

        class Op:
            name, payload, success = f"open_session({session_id!r})", {"session_id": session_id}, not refuse

            def wait(self):
                return self
                yield

        op = Op()
        self.control_ops.append(op)
        return op

    def start_req(self, **kwargs):
        after = kwargs.get("after")
        history = (list(kwargs["input_ids"]) if after is None else
                   list(after.expected_prompt) + [7] * after.max_new_tokens + list(kwargs["input_ids"]))
        handle = SimpleNamespace(session=kwargs["session"],
                                 expected_prompt=history, max_new_tokens=kwargs["max_new_tokens"],
                                 last_req=None, kwargs=kwargs, finished=True)
        self.sent.append(handle)
        return handle


def test_a_session_turn_opens_a_conversation_or_continues_a_turn_in_its_own_session():
    ctx, reqs = _SessionCtx(), [SimpleNamespace(session=None, expected_prompt=None)]  # a plain request first

    def turn(after, length=8, new=4):
        return list(_drain(explore_helpers.session_turn(ctx, reqs, after=after, family=1, length=length,
                                                        max_new_tokens=new)))

    turn(None)  # a conversation's first turn: a session opened for it, numbered as session_op numbers them
    turn(None)
    turn(0)  # continues the first turn (index among the program's turns, not its requests), in its session
    turn(7)  # 7 modulo 3 turns: the second
    first, second, third, fourth = ctx.sent
    assert [h.session for h in ctx.sent] == [
        "explored-session-1", "explored-session-2", "explored-session-1", "explored-session-2"]
    assert first.kwargs["after"] is None and third.kwargs["after"] is first and fourth.kwargs["after"] is second
    assert third.kwargs["input_ids"] == prompts.prompt_ids(1, 8) and third.kwargs["temperature"] == 0.0
    assert reqs[1:] == ctx.sent  # every turn is judged at the end like any request
    # a history that could pass TURN_MAX_HISTORY is not sent; nor a first turn whose open SGLang refuses
    long_ago = SimpleNamespace(session="s",
                               expected_prompt=[5] * (explore_helpers.TURN_MAX_HISTORY - 20), max_new_tokens=12,
                               finished=True)
    reqs[:] = [long_ago]
    assert turn(0, length=63) == [] and len(ctx.sent) == 4  # 300 + 12 + 63 tokens
    turn(0, length=1, new=2)
    assert len(ctx.sent) == 5 and ctx.sent[-1].kwargs["after"] is long_ago
    # the next turn waits for the one it continues to end (a chat client sends it after the answer),
    # a bounded number of iterations; an eager one is sent at once
    running = ctx.sent[-1]
    running.finished = False
    gen = explore_helpers.session_turn(ctx, [running], after=0, family=0, length=1, max_new_tokens=1)
    assert [next(gen) for _ in range(3)] == [None] * 3 and len(ctx.sent) == 5
    running.finished = True
    assert list(_drain(gen)) == [] and ctx.sent[-1].kwargs["after"] is running
    running.finished = False
    assert len(list(_drain(explore_helpers.session_turn(ctx, [running], after=0, family=0, length=1,
                                                         max_new_tokens=1)))) == explore_helpers.TURN_WAIT_STEPS
    assert list(_drain(explore_helpers.session_turn(ctx, [running], after=0, family=0, length=1, max_new_tokens=1,
                                                    eager=True))) == [] and len(ctx.sent) == 8
    refused = _SessionCtx(refuse=True)
    assert list(_drain(explore_helpers.session_turn(refused, [], after=None, family=0, length=8,
                                                    max_new_tokens=2))) == [] and refused.sent == []


@pytest.mark.parametrize("topology", ["pp1-overlap", "pp1-normal", "pp4", "pp1-hicache", "pp1-lora"])
def test_session_turns_are_drawn_on_every_topology_and_compile_to_their_helper(topology):
    draw = strategies.action_strategy(topology)
    # simplest: a conversation's first turn; then one continuing the program's first turn, eager or not
    assert find(draw, lambda a: isinstance(a, A.Turn), settings=NO_DB) == A.Turn(None, 0, 8, 1)
    assert find(draw, lambda a: isinstance(a, A.Turn) and a.after is not None, settings=NO_DB) == A.Turn(0, 0, 8, 1)
    assert find(draw, lambda a: isinstance(a, A.Turn) and a.eager, settings=NO_DB) == A.Turn(None, 0, 8, 1, eager=True)
    program = [A.Start(8, 0, 4), A.Turn(None, 1, 65, 3), A.Pause("in_place"), A.Turn(2, 0, 1, 5, stream=True),
               A.Turn(0, 1, 8, 2, eager=True)]
    text = A.to_source(program).text
    compile(text, "<program>", "exec")
    assert "    yield from explore.session_turn(ctx, reqs, after=None, family=1, length=65, max_new_tokens=3)\n" in text
    assert ("    if explore.can_start(ctx):\n        yield from explore.session_turn(ctx, reqs, after=2, family=0, "
            "length=1, max_new_tokens=5, stream=True)\n") in text  # held back while the tokenizer is paused
    assert "a turn continuing turn #2 once it ended: its history, then 1 tokens of family 0" in text
    assert "explore.session_turn(ctx, reqs, after=0, family=1, length=8, max_new_tokens=2, eager=True)" in text
    assert "a turn continuing turn #0 (sent at once)" in text
    assert failure_db.decode(failure_db.encode(program)) == program
    assert A.resolve_prompts(program)[1:] == [None] * 4  # not a Resend's earlier request


# --- a weight update that fails (grammar 14) ----------------------------------------------------

def test_an_update_of_a_missing_checkpoint_is_drawn_and_compiles_to_a_failing_disk_update():
    draw = strategies.action_strategy("pp1-normal")
    assert find(draw, lambda a: isinstance(a, A.UpdateWeights) and a.missing, settings=NO_DB) == \
        A.UpdateWeights(False, missing=True)
    source = A.to_source([A.Start(8, 0, 4), A.UpdateWeights(True, missing=True)]).text
    assert "yield from explore.update_weights(ctx, reqs, flush_cache=True, missing=True)" in source
    assert "of a checkpoint that does not exist (it must fail and change nothing)" in source
    compile(source, "<program>", "exec")


def test_a_missing_checkpoint_update_posts_the_missing_path_from_disk(monkeypatch):
    """Whatever form was drawn with it, the update posts the disk update of a
    path no checkpoint is at, and the coverage table names it apart."""
    import os
    from scripted_runtime.scheduler_side.explore import phases

    ctx = _FakeCtx()
    ctx.describe = lambda: "idle"
    ctx.control_ops = [SimpleNamespace(name="pause_generation")]  # paused: the update is posted at once
    posted = []

    class _Op:
        processed_step, success = 1, False
        http = SimpleNamespace(wait=lambda timeout: True)

        def wait(self, max_steps):
            return
            yield

    def update(**kw):
        posted.append(kw)
        return _Op()

    ctx.update_weights_from_disk = update
    monkeypatch.setattr(explore_helpers.output_oracle, "update_source", lambda ctx: ("/served", "auto"))
    list(_drain(explore_helpers.update_weights(ctx, [], flush_cache=True, tensor=True, missing=True)))
    assert [kw["model_path"] for kw in posted] == [explore_helpers.MISSING_CHECKPOINT]
    assert posted[0]["load_format"] is None and not os.path.exists(explore_helpers.MISSING_CHECKPOINT)
    assert phases.op_kind("update_weights_from_disk", {"model_path": explore_helpers.MISSING_CHECKPOINT,
                                                       "flush_cache": True}) == "update_weights(missing)"
    assert phases.op_kind("update_weights_from_disk", {"flush_cache": True}) == "update_weights(flush)"


def test_a_step_action_spans_up_to_eight_rounds_of_the_loop():
    """Grammar 16: a step action runs 1 to 8 scheduler rounds, a round being
    one iteration at pp=1 and the six micro-batch slots at pp=4, where a
    request decodes one token a round."""
    for topology, most in (("pp1-overlap", 8), ("pp1-normal", 8), ("pp4", 48)):
        draw = strategies.action_strategy(topology)
        assert find(draw, lambda a: isinstance(a, A.Steps), settings=NO_DB) == A.Steps(1)
        assert find(draw, lambda a: isinstance(a, A.Steps) and a.n >= most, settings=NO_DB) == A.Steps(most)
        with pytest.raises(Exception):
            find(draw, lambda a: isinstance(a, A.Steps) and a.n > most, settings=settings(max_examples=300, database=None))


@settings(max_examples=200, deadline=None)
@given(strategies.bursts())
def test_a_burst_is_requests_posted_together_at_the_boundary_of_one_pass(burst):
    """A burst's requests are posted in one iteration (nothing between them,
    none waiting for a micro-batch slot); under pressure, taken once the
    engine is idle, the free KV left holds the first k requests' admission
    needs and less than k + 1's."""
    starts = [a for a in burst if isinstance(a, A.Start)]
    assert len(starts) in strategies.BURST_SIZES and all(s.beside is None for s in starts)
    if len(burst) == len(starts):  # no pressure: the requests alone
        return
    if isinstance(burst[0], A.Start):  # grammar 18: pressure while they decode, held 3 to 6 rounds
        *posted, decode, steps, release = burst
        assert posted == starts and isinstance(decode, A.OnPhase) and decode.phase == "decode"
        assert isinstance(decode.op, A.ExhaustKv) and decode.op.evict_cache
        assert 0 <= decode.op.leave_pages <= len(starts)
        assert isinstance(steps, A.Steps) and 3 <= steps.n <= 6 and release == A.ReleaseKv()
        return
    idle, *middle, steps, release = burst
    assert isinstance(idle, A.OnPhase) and idle.phase == "idle"
    exhaust = idle.op
    assert isinstance(exhaust, A.ExhaustKv) and exhaust.evict_cache and middle == starts
    assert isinstance(steps, A.Steps) and isinstance(release, A.ReleaseKv)
    needs = [s.prompt_len + s.max_new_tokens + 1 for s in starts]
    assert any(sum(needs[:k]) <= exhaust.leave_pages < sum(needs[:k + 1]) for k in range(1, len(needs)))


def test_bursts_are_a_sequence_kind_and_shrink_to_short_prompts():
    kinds = strategies.action_kinds("pp4", (), None)
    assert sum(1 for _, sequence in kinds if sequence) == 5  # paused, bracketed, observed, burst twice
    pressured = [find(strategies.bursts(), lambda b: isinstance(b[0], A.OnPhase) and len(b) == 5,
                      settings=settings(NO_DB, max_examples=500))]
    assert pressured[0][1].prompt_len in strategies.SHORT_PROMPT_LENGTHS  # shrinks to short prompts


def test_a_step_inside_a_sequence_runs_one_to_three_rounds():
    """Grammar 18: a step between a sequence's ends is 1 to 3 scheduler
    rounds, so at pp=4 (six micro-batch slots a round) 1 to 18 iterations:
    a decode under a KV bracket's pressure makes a few tokens, enough to
    run the free KV down, before the KV comes back."""
    for topology, most in (("pp1-overlap", 3), ("pp1-normal", 3), ("pp4", 18)):
        paused_kind = [kind for kind, sequence in strategies.action_kinds(topology, (), None) if sequence][0]
        draw = paused_kind(strategies.ALL_OP_KINDS)

        def longest(seq):
            return max((a.n for a in seq if isinstance(a, A.Steps)), default=0)

        assert longest(find(draw, lambda s: longest(s) >= most, settings=settings(NO_DB, max_examples=2000))) == most
        with pytest.raises(Exception):
            find(draw, lambda s: longest(s) > most, settings=settings(max_examples=300, database=None))


def _run_of_starts(seq) -> int:
    best = run = 0
    for a in seq:
        run = run + 1 if isinstance(a, A.Start) else 0
        best = max(best, run)
    return best


_draws = derandomized_draws


def test_a_lowered_limit_may_hold_requests_posted_together():
    """Grammar 18: inside a set-limit bracket requests may be posted in one
    iteration (under PP only those meet in one micro-batch's prefill, which
    the limit bounds); four in a row only come from such a burst, and no
    other bracket holds one."""
    start = strategies.starts()
    together = strategies.together()
    limit_only = (strategies.CONTROL_OP_NAMES.index("set_limit"),)  # every bracket a lowered limit
    slow_down_only = (strategies.CONTROL_OP_NAMES.index("slow_down"),)
    drawn = _draws(strategies.bracketed(limit_only, ("decode",), ("w",), 24, start, False, burst=together), 200)
    bursts = [seq for seq in drawn if _run_of_starts(seq) >= 4]
    assert bursts and all(seq[-1] == A.SetLimit("default") for seq in bursts), bursts[:1]
    for kept, burst in ((limit_only, None), (slow_down_only, together)):  # no burst given; another bracket
        drawn = _draws(strategies.bracketed(kept, ("decode",), ("w",), 24, start, True, burst=burst), 200)
        assert not any(_run_of_starts(seq) >= 4 for seq in drawn)


class _PauseAheadCtx:
    """What ``explore.release_memory`` reads of ``ctx``: a pause the program
    posted stays unanswered for ``pending`` iterations, and SGLang's
    precondition is refused while it does (``memory_release_allowed``)."""

    def __init__(self, pending: int):
        self.pending, self.released_memory, self.posted = pending, set(), []
        self.scheduler = SimpleNamespace(mbs=[None] * 6)

    def unsettled_ops_of_type(self, request_type):
        return ["pause"] if request_type == "PauseGenerationReqInput" and self.pending else []

    @property
    def memory_release_allowed(self):
        return not self.pending

    def release_memory_occupation(self, names):
        self.posted.append(names)
        return SimpleNamespace(wait=lambda max_steps: iter(()))


def _drive(gen, ctx):
    steps = 0
    try:
        while True:
            next(gen)
            steps += 1
            ctx.pending = max(0, ctx.pending - 1)
    except StopIteration as stop:
        return steps, stop.value


def test_a_release_waits_for_the_programs_pause_to_be_answered():
    """Grammar 18: a release right behind a pause steps until the pause was
    answered and then releases (before it, SGLang's precondition was read
    with the pause still ahead and the release always skipped); bounded."""
    ctx = _PauseAheadCtx(pending=3)
    steps, op = _drive(explore_helpers.release_memory(ctx, "kv_cache"), ctx)
    assert (steps, ctx.posted) == (3, [["kv_cache"]]) and op is not None
    stuck = _PauseAheadCtx(pending=10 ** 6)
    steps, op = _drive(explore_helpers.release_memory(stuck, "all"), stuck)
    assert op is None and stuck.posted == [] and steps == 4 * 6
