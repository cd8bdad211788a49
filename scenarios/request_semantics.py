"""How a request must end, whatever ran beside it: the request-semantics
contract (docs/checks.md, "The request-semantics contract") on requests the
explorer does not draw yet: stop tokens, EOS honoured and ignored, a length
cap of one.

And what the client receives: the answer-delivery contract (docs/checks.md,
"The answer-delivery contract") on streamed and plain answers.

Run them:
  scripted-runtime run scenarios/request_semantics.py:length_caps
  scripted-runtime run scenarios/request_semantics.py:stop_tokens
  scripted-runtime run scenarios/request_semantics.py:streamed_answers
  scripted-runtime run scenarios/request_semantics.py:logprobs
  scripted-runtime run --topology pp1-text scenarios/request_semantics.py:stop_strings

And what a ``return_logprob`` request's logprobs must be: the logprob
contract (docs/checks.md, "The logprob contract").
"""


def length_caps(ctx, caps=(1, 2, 5)):
    """Greedy requests that ignore EOS, side by side, each asking for a
    different number of tokens: each must end by length with exactly that
    many (the contract and the output oracle both judge them)."""
    from scripted_runtime.scheduler_side.explore import program as explore

    reqs = [ctx.start_req(input_ids=[1] * 12, max_new_tokens=n, ignore_eos=True, temperature=0.0) for n in caps]
    return (yield from explore.end_state_checks(ctx, reqs))


def stop_tokens(ctx, max_new_tokens=8):
    """A request run first shows what the model emits; then the same prompt
    with its third token as a stop token must end on that token as a
    ``stop`` (its answer holds three tokens), with ``ignore_eos`` the same
    stop token must be ignored (SGLang skips stop token ids under it), and a
    stop token the model never emits changes nothing."""
    from scripted_runtime.scheduler_side.explore import program as explore

    prompt = [3] * 20
    probe = ctx.start_req(input_ids=prompt, max_new_tokens=max_new_tokens, ignore_eos=True, temperature=0.0)
    yield from ctx.wait_finished(probe, max_steps=100)
    out = probe.output_ids
    third = out[2]
    first_at = out.index(third)  # the stop fires on the token's first appearance
    never = next(t for t in range(4, 512) if t not in out and t != 2)
    stopped = ctx.start_req(input_ids=prompt, max_new_tokens=max_new_tokens, ignore_eos=False,
                            temperature=0.0, stop_token_ids=[third])
    ignored = ctx.start_req(input_ids=prompt, max_new_tokens=max_new_tokens, ignore_eos=True,
                            temperature=0.0, stop_token_ids=[third])
    unmet = ctx.start_req(input_ids=prompt, max_new_tokens=max_new_tokens, ignore_eos=True,
                          temperature=0.0, stop_token_ids=[never])
    reqs = [probe, stopped, ignored, unmet]
    checks = yield from explore.end_state_checks(ctx, reqs)
    assert checks["answers_checked"] == len(reqs), checks
    # what the client got over HTTP, too (it lands at a wall-clock time: step until it did)
    yield from ctx.wait_until(lambda: all(h.http.done for h in reqs), max_steps=200, what="the HTTP answers")
    stopped_out = stopped.http.body["output_ids"]
    assert stopped_out == out[:first_at + 1], (stopped_out, out)
    assert stopped.http.body["meta_info"]["finish_reason"] == {"type": "stop", "matched": third}, stopped.http.body
    assert ignored.http.body["output_ids"] == out and unmet.http.body["output_ids"] == out
    return {"probe": out, "stopped": stopped_out, **checks}


def streamed_answers(ctx, max_new_tokens=6):
    """Streamed and plain requests side by side, among them a two-chunk
    prompt that ends at its prefill (one new token): every answer must
    arrive and hold exactly what the scheduler emitted, and every event of
    a streamed one must extend the one before (the end-state checks judge
    it: ``answer_delivery``)."""
    from scripted_runtime.scheduler_side.explore import program as explore

    reqs = [
        ctx.start_req(input_ids=explore.prompt_ids(0, 20), max_new_tokens=max_new_tokens, ignore_eos=True,
                      temperature=0.0, stream=True),
        ctx.start_req(input_ids=explore.prompt_ids(1, 20), max_new_tokens=max_new_tokens, ignore_eos=True,
                      temperature=0.0),
        ctx.start_req(input_ids=explore.prompt_ids(2, 100), max_new_tokens=1, ignore_eos=True,
                      temperature=0.0, stream=True),
        ctx.start_req(input_ids=explore.prompt_ids(1, 100), max_new_tokens=1, ignore_eos=True, temperature=0.0),
    ]
    checks = yield from explore.end_state_checks(ctx, reqs)
    assert checks["answers_delivered"] == len(reqs), checks
    events = [len(h.http.chunks) if h.http.chunks is not None else None for h in reqs]
    return {"events": events, **checks}


def logprobs(ctx, max_new_tokens=5):
    """Requests asking for logprobs in the shapes their bookkeeping differs
    in: a two-chunk prompt from token 0 prefilled beside a decoding request
    and a second logprob request (its input logprobs gathered over two
    chunks, at an offset in a shared batch), one from inside its second
    chunk, output logprobs only (SGLang's default start), one admitted while
    the others decode, and the first prompt sent again from token 32 (a
    start below the prefix the tree holds: SGLang must not reuse the cache
    past it), streamed, and again from token 0. Each request's logprobs must name its tokens and its
    prompt from its start, a greedy token be its top row's best, and each
    value be the prompt's run alone (the end-state checks: ``logprobs``)."""
    from scripted_runtime.scheduler_side.explore import program as explore

    def start(family, length, start_len, **kw):
        return ctx.start_req(input_ids=explore.prompt_ids(family, length), max_new_tokens=max_new_tokens,
                             ignore_eos=True, temperature=0.0, top_logprobs=2, logprob_start_len=start_len, **kw)

    plain = ctx.start_req(input_ids=explore.prompt_ids(2, 20), max_new_tokens=12, ignore_eos=True, temperature=0.0)
    yield from ctx.steps(2)
    reqs = [plain, start(0, 100, 0), start(1, 129, 70), start(2, 8, -1)]
    yield from ctx.steps(4)
    reqs.append(start(1, 40, 3))
    yield from ctx.wait_until(lambda: reqs[1].status == "finished", max_steps=200, what="the first prompt to finish")
    again = start(0, 100, 32, stream=True)
    from_zero = start(0, 100, 0)  # 0: the falsy start, all of the prompt
    reqs += [again, from_zero]
    checks = yield from explore.end_state_checks(ctx, reqs)
    assert checks["logprobs_checked"] == len(reqs) - 1, checks
    cached = [getattr(h.last_req, "cached_tokens", None) for h in (again, from_zero)]
    assert cached == [32, 0], f"the resent prompts reused {cached} cached tokens, their logprob starts are 32 and 0"
    return {"cached": cached, **checks}


def _stop_picks(tokenizer, output):
    """Stop strings read off ``output`` (a request's greedy tokens): per
    kind, (the stop, the first output token whose window holds it, or None
    where SGLang misses it by design), for every kind the output offers
    (``program.stop_text_of`` builds each, as the explorer's do):

    * ``straddling``: the last character of one token and the first of the
      next, encoded as one token (a window of 2): caught, and missed by a
      window one token short;
    * ``two_tokens``: two tokens' text; ``one_token``: one token's;
    * ``three_tokens``: three tokens' text encoded as one token (a window
      of 2): missed by design where it occurs nowhere shorter.
    """
    from scripted_runtime.scheduler_side import stop_strings as rule
    from scripted_runtime.scheduler_side.explore.program import stop_text_of

    decode, encode = rule.codec(tokenizer)
    specials = set(tokenizer.all_special_ids)
    picks = {}
    for span, kind in ((0, "straddling"), (2, "two_tokens"), (3, "three_tokens"), (1, "one_token")):
        for k in range(len(output) - max(span, 2) + 1):
            if any(t in specials for t in output[k:k + max(span, 2)]):
                continue
            text = stop_text_of(decode, output, k, span)
            if not text or (span in (0, 3) and len(encode(text)) != 1):
                continue
            picks[kind] = (text, rule.first_hit(output, [text], decode, rule.window_len([text], encode))[0])
            break
    return picks


def stop_strings(ctx, max_new_tokens=12, families=3):
    """Stop strings (a server with a tokenizer: ``--topology pp1-text``).
    A greedy request per prompt shows what the model emits; then the same
    prompts with stop strings read off those outputs (``_stop_picks``):
    one starting inside a token (its occurrence spans two tokens, its
    encoding one: caught, the request ends there as a ``stop``), two tokens'
    text, three tokens' text that encodes as one (SGLang's window misses it
    by design: the request runs to its length), one token's text. The request contract judges each by SGLang's stop-string rule
    (``scheduler_side/stop_strings.py``); the output oracle judges those
    that ran to their length. Returns how many stopped on a string."""
    from scripted_runtime.scheduler_side.explore import program as explore
    from scripted_runtime.scheduler_side.explore.prompts import prompt_ids

    tokenizer = getattr(ctx.scheduler, "tokenizer", None)
    if tokenizer is None:
        raise RuntimeError("stop_strings needs a server with a tokenizer: run it with --topology pp1-text")
    prompts = [prompt_ids(f, 30) for f in range(families)]
    probes = [ctx.start_req(input_ids=p, max_new_tokens=max_new_tokens, ignore_eos=True, temperature=0.0)
              for p in prompts]
    yield from ctx.wait_finished(*probes, max_steps=200)
    reqs, expected = list(probes), []
    for prompt, probe in zip(prompts, probes):
        for kind, (stop, at) in _stop_picks(tokenizer, list(probe.output_ids)).items():
            reqs.append(ctx.start_req(input_ids=prompt, max_new_tokens=max_new_tokens, ignore_eos=True,
                                      temperature=0.0, stop=[stop]))
            expected.append((kind, stop, at))
    result = yield from explore.end_state_checks(ctx, reqs)
    outcomes = [(kind, stop, at, h.finish_reason, len(h.output_ids)) for (kind, stop, at), h in
                zip(expected, reqs[len(probes):])]
    result["stopped_on_a_string"] = sum(1 for o in outcomes if o[3] == "FINISH_MATCHED_STR")
    result["missed_by_design"] = sum(1 for o in outcomes if o[2] is None)
    result["outcomes"] = outcomes
    return result
