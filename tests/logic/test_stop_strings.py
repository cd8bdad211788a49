"""The tiny tokenizer (``user_side/models/tokenizer.py``) and the stop-string
rule (``scheduler_side/stop_strings.py``): the rule checked against SGLang
0.5.23's own ``Req`` finish code, run on a stand-in object (no server)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from scripted_runtime.scheduler_side import stop_strings as S
from scripted_runtime.user_side.models import tokenizer as T


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    import os

    old = os.environ.get("SCRIPTED_RUNTIME_MODELS_DIR")
    os.environ["SCRIPTED_RUNTIME_MODELS_DIR"] = str(tmp_path_factory.mktemp("models"))
    try:
        folder = T.tokenizer_dir()
        assert T.tokenizer_dir() == folder  # written once, found again
    finally:
        if old is None:
            os.environ.pop("SCRIPTED_RUNTIME_MODELS_DIR")
        else:
            os.environ["SCRIPTED_RUNTIME_MODELS_DIR"] = old
    # loaded as the server loads it (SGLang's get_tokenizer adds the attributes its Req reads)
    loader = pytest.importorskip("sglang.srt.utils.hf_transformers.tokenizer")
    return loader.get_tokenizer(str(folder))


def test_the_tokenizer_covers_the_tiny_models_vocabulary_and_decodes_by_concatenation(tok):
    assert len(tok) == T.VOCAB_SIZE and tok.eos_token_id == 2 and tok.bos_token_id == 1
    vocab, _ = T.vocab_and_merges()
    assert len(vocab) == T.VOCAB_SIZE and set(vocab.values()) == set(range(T.VOCAB_SIZE))
    a, b, c, bc, abc = (vocab[t] for t in ("a", "b", "c", "bc", "abc"))
    assert tok.encode("abc", add_special_tokens=False) == [abc]  # encode compresses
    assert tok.decode([a, b, c]) == tok.decode([a, bc]) == tok.decode([abc]) == "abc"  # three ways to emit it
    assert tok.decode([a, 2, b], skip_special_tokens=False) == "a<EOS>b"


def test_a_stop_is_seen_only_inside_the_window_of_its_encoding_plus_one(tok):
    decode, encode = S.codec(tok)
    vocab, _ = T.vocab_and_merges()
    a, b, c, bc, d = (vocab[t] for t in ("a", "b", "c", "bc", "d"))
    assert S.window_len(["abc"], encode) == 2
    assert S.first_hit([d, a, bc, d], ["abc"], decode, 2) == (3, "abc")
    assert S.first_hit([d, a, b, c, d], ["abc"], decode, 2) == (None, None)  # three tokens: missed by design
    assert S.first_hit([a, b, c], ["bc", "abc", "b"], decode, 3) == (2, "b")  # list order, first token that holds one


def test_the_violations_name_what_the_window_shows(tok):
    decode, encode = S.codec(tok)
    vocab, _ = T.vocab_and_merges()
    a, bc, d = (vocab[t] for t in ("a", "bc", "d"))
    stop = {"type": "stop", "matched": "abc"}
    assert S.violation([d, a, bc], stop, ["abc"], decode=decode, encode=encode) is None
    assert "yet 4 tokens were emitted" in S.violation([d, a, bc, d], stop, ["abc"], decode=decode, encode=encode)
    assert "no window" in S.violation([d, d], stop, ["abc"], decode=decode, encode=encode)
    length = {"type": "length", "length": 4}
    assert "yet the request finished" in S.violation([d, a, bc, d], length, ["abc"], decode=decode, encode=encode)
    assert S.violation([d, a, bc, d], {"type": "abort"}, ["abc"], decode=decode, encode=encode).startswith(
        "stop string 'abc' is in")
    assert S.violation([d, a, bc], {"type": "abort"}, ["abc"], decode=decode, encode=encode) is None
    assert S.violation([d, a, bc, d], length, [], decode=decode, encode=encode) is None


def _sglang_outcome(tok, gen, stops, max_new, stop_token_ids=None):
    """SGLang's own ``Req.update_finish_state`` over the tokens ``gen``,
    on a stand-in holding just what it reads."""
    schedule_batch = pytest.importorskip("sglang.srt.managers.schedule_batch")
    from sglang.srt.sampling.sampling_params import SamplingParams

    class Stand:
        pass

    for name in ("finished", "update_finish_state", "_check_vocab_boundary_finish", "_check_str_based_finish",
                 "_check_token_based_finish", "_cap_finished_len_at_max_new_tokens", "tail_str",
                 "_stop_match_tail_len", "_locate_str_stop_finished_len"):
        setattr(Stand, name, getattr(schedule_batch.Req, name))
    params = SamplingParams(stop=stops, max_new_tokens=max_new, stop_token_ids=stop_token_ids)
    params.normalize(tok)
    r = Stand()
    r.sampling_params, r.tokenizer, r.decoded_text = params, tok, ""
    r.output_ids, r.finished_reason, r.finished_len, r.to_finish = [], None, None, None
    r.eos_token_ids, r.vocab_size, r.grammar = {2}, T.VOCAB_SIZE, None
    for t in gen:
        r.output_ids.append(t)
        r.update_finish_state(1)
        if r.finished():
            break
    n = r.finished_len if r.finished_len is not None else len(r.output_ids)
    reason = r.finished_reason.to_json() if r.finished_reason else {"type": "length", "length": n}
    return list(r.output_ids[:n]), reason


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_the_rule_agrees_with_sglangs_own_finish_code(tok, data):
    decode, encode = S.codec(tok)
    gen = data.draw(st.lists(st.integers(3, T.VOCAB_SIZE - 1) | st.just(2), min_size=1, max_size=24))
    text = decode(gen)
    picks = st.tuples(st.integers(0, len(text) - 1), st.integers(1, 6)).map(lambda p: text[p[0]:p[0] + p[1]])
    stops = [s for s in data.draw(st.lists(picks | st.text("abcdefgh", min_size=2, max_size=5), min_size=1,
                                           max_size=3)) if "<" not in s and ">" not in s] or ["hhhh"]
    ids, reason = _sglang_outcome(tok, gen, stops, max_new=data.draw(st.sampled_from((len(gen), 64))))
    assert S.violation(ids, reason, stops, decode=decode, encode=encode) is None, (gen, stops, ids, reason)
    # and the window one token short (the sixth blind set's mutant) disagrees somewhere: see the next test


def test_a_window_one_token_short_is_a_violation(tok):
    """What ``blind6_stop_str_window_short`` does: SGLang's window less its
    slack token misses 'abc' emitted as a|bc (encoding: one token, so a
    window of 1); the rule names the request that ran past it."""
    decode, encode = S.codec(tok)
    vocab, _ = T.vocab_and_merges()
    gen = [vocab["d"], vocab["a"], vocab["bc"], vocab["d"], vocab["e"]]
    assert S.first_hit(gen, ["abc"], decode, 1) == (None, None)  # the short window never sees it
    problem = S.violation(gen, {"type": "length", "length": 5}, ["abc"], decode=decode, encode=encode)
    assert problem and "'abc' is in the text of output tokens 1-2" in problem, problem


def test_a_start_with_a_stop_span_posts_the_reference_text_as_its_stop_string():
    from scripted_runtime.user_side.explore import actions as A

    program = [A.Start(8, 0, 6, stop_at=2, stop_span=2), A.Start(8, 1, 6, stop_at=1), A.Start(64, 0, 4, stop_at=2,
                                                                                           stop_span=2)]
    text = A.to_source(program).text
    compile(text, "program.py", "exec")
    assert "texts = yield from explore.stop_texts(ctx, [(0, 8, 2, 2), (0, 64, 2, 2)])" in text, text
    assert "stops = yield from explore.stop_tokens(ctx, [(1, 8, 1)])" in text, text
    assert "stop=[texts[0, 8, 2, 2]]" in text and "stop_token_ids=[stops[1, 8, 1]]" in text, text
    assert "stop string: the text of its reference's tokens 2-3" in A.describe_program(program)[0]


def test_only_a_topology_with_a_tokenizer_draws_stop_strings():
    from hypothesis import Phase, find

    from scripted_runtime.user_side import engine_config
    from scripted_runtime.user_side.explore import strategies as Strat

    assert engine_config.features_of("pp1-text") == ("text",) and "text" not in engine_config.features_of("pp1-overlap")
    quick = settings(database=None, max_examples=500, derandomize=True)
    for span in (0, 1, 2, 3):  # every kind of stop string is drawn with a tokenizer
        find(Strat.starts(text=True), lambda a, span=span: a.stop_at is not None and a.stop_span == span,
             settings=quick)

    @settings(max_examples=100, database=None, derandomize=True, deadline=None)
    @given(Strat.starts())
    def never(start):  # and none without one
        assert start.stop_span is None

    never()
    # and a pp1-text program's requests are drawn so (the topology's features reach its starts)
    find(Strat.programs("pp1-text"), lambda p: any(getattr(a, "stop_span", None) is not None for a in p),
         settings=settings(quick, phases=[Phase.generate]))  # found is enough: no shrinking


def test_a_stop_text_is_whole_tokens_or_straddles_two():
    from scripted_runtime.scheduler_side.explore.program import stop_text_of

    texts = ["abc", "def", "g", ""]
    decode = lambda ids: "".join(texts[i] for i in ids)  # noqa: E731
    assert stop_text_of(decode, [0, 1, 2], 0, 0) == "cd"  # starts inside token 0
    assert stop_text_of(decode, [0, 1, 2], 1, 2) == "defg" and stop_text_of(decode, [0, 1, 2], 2, 1) == "g"
    assert stop_text_of(decode, [0, 3], 0, 0) == ""  # a token with no text: none
