"""The logprob contract's rules (pure logic): what a return_logprob request's
logprobs must be, with and without the output oracle's reference."""
from scripted_runtime.scheduler_side import logprob_contract as lc
from scripted_runtime.user_side.explore import actions as A

PROMPT = [5, 6, 7, 8, 9]
OUT = [11, 12, 13]


def _lp(**over):
    lp = {"input_val": [None, -1.0, -2.0], "input_idx": [7, 8, 9], "output_val": [-0.5, -0.25, -1.0],
          "output_idx": list(OUT), "top_val": [[-0.5, -2.0], [-0.25, -3.0], [-1.0, -1.5]],
          "top_idx": [[11, 3], [12, 4], [13, 5]], "top_n": 2, "start": 2}
    lp.update(over)
    return lp


def _shape(lp, *, output=OUT, start=2, greedy=True, prefilled=True):
    return lc.shape_violation(lp, output=output, prompt=PROMPT, start=start, greedy=greedy, prefilled=prefilled)


def test_a_request_as_sglang_records_it_passes():
    assert _shape(_lp()) is None
    # an output cut at a stop: the logprobs of tokens past finished_len are not sent, not judged
    assert _shape(_lp(), output=OUT[:2]) is None


def test_a_missing_or_misnamed_output_logprob_is_a_violation():
    assert "2 output logprobs for 3 emitted tokens" in _shape(_lp(output_val=[-0.5, -0.25]))
    assert "names token 99, the token emitted there is 12" in _shape(_lp(output_idx=[11, 99, 13]))
    assert "not a log-probability" in _shape(_lp(output_val=[-0.5, 0.5, -1.0]))
    assert "not a log-probability" in _shape(_lp(output_val=[-0.5, float("nan"), -1.0]))


def test_a_greedy_token_must_be_its_rows_best_and_no_token_above_it():
    row_of_another = [[-0.5, -2.0], [-0.1, -0.25], [-1.0, -1.5]]  # row 1's best beats the greedy token
    assert "below the best of its top row" in _shape(_lp(top_val=row_of_another))
    assert _shape(_lp(top_val=row_of_another), greedy=False) is None, "a sampled token need not be the best"
    assert "above the best of its top row" in _shape(_lp(top_val=[[-0.5, -2.0], [-0.5, -3.0], [-1.0, -1.5]]),
                                                      greedy=False)
    assert "not best first" in _shape(_lp(top_val=[[-0.5, -2.0], [-0.25, -3.0], [-1.5, -1.0]]), greedy=False)
    assert "top-logprob rows for 3" in _shape(_lp(top_val=[[-0.5, -2.0]]))
    assert _shape(_lp(top_n=0, top_val=[], top_idx=[])) is None, "no top rows asked for, none judged"


def test_input_logprobs_name_the_prompt_from_the_start_first_none():
    assert "the prompt from logprob_start_len=1" in _shape(_lp(), start=1)
    assert "not None" in _shape(_lp(input_val=[-0.1, -1.0, -2.0]))
    assert "2 input logprob values for 3" in _shape(_lp(input_val=[None, -1.0]))
    assert "no input logprobs after its prefill" in _shape(_lp(input_val=None, input_idx=None))
    # aborted before its last chunk: SGLang computes them there, nothing to judge
    assert _shape(_lp(input_val=None, input_idx=None), prefilled=False) is None
    assert _shape(_lp(input_val=[], input_idx=[]), prefilled=False) is None, "or empty containers"
    assert "the prompt from" in _shape(_lp(input_idx=[7, 8, 0]), prefilled=False), "those it has are judged"
    # output logprobs only (start at the prompt's end): none expected
    assert _shape(_lp(input_val=[], input_idx=[]), start=len(PROMPT)) is None
    assert _shape(_lp(), start=None) is None, "a start not judged (a session turn SGLang overrode)"


def test_the_default_start_means_no_input_logprobs():
    assert lc.resolved_start(None, 9) == 9
    assert lc.resolved_start(-1, 9) == 9
    assert lc.resolved_start(0, 9) == 0
    assert lc.resolved_start(4, 9) == 4


def test_values_are_compared_with_the_alone_run_within_the_tolerance():
    reference = {"input": [None, -3.0, -0.75, -1.0, -2.0], "output": [-0.5, -0.25, -1.0, -4.0]}
    assert lc.value_mismatch(_lp(), output=OUT, compared=3, start=2, reference=reference) is None
    noisy = _lp(output_val=[-0.5 + 8e-6, -0.25, -1.0])  # another batch composition: float noise
    assert lc.value_mismatch(noisy, output=OUT, compared=3, start=2, reference=reference) is None
    swapped = _lp(output_val=[-0.25, -0.5, -1.0])  # another position's values
    assert "output token 0 (11) has logprob -0.250000" in lc.value_mismatch(
        swapped, output=OUT, compared=3, start=2, reference=reference)
    # only the tokens the oracle compared equal to the reference's are judged
    assert lc.value_mismatch(_lp(output_val=[-0.5, -0.25, -9.0]), output=OUT, compared=2, start=2,
                             reference=reference) is None
    shifted = _lp(input_val=[None, -0.75, -1.0])  # the input logprobs of the positions before
    assert "input logprob of prompt token 3 is -0.750000" in lc.value_mismatch(
        shifted, output=OUT, compared=3, start=2, reference=reference)


def test_the_explorer_clamps_a_drawn_start_into_the_prompt_and_compiles_it():
    assert A.logprob_start_of(70, 8) == 7 and A.logprob_start_of(70, 100) == 70 and A.logprob_start_of(-1, 8) == -1
    source = A.to_source([A.Start(8, 0, 3, logprob_start=70), A.Resend(0, 0, 2, logprob_start=-1),
                          A.Start(8, 1, 3)]).text
    assert "top_logprobs=2, logprob_start_len=7)" in source
    assert "top_logprobs=2, logprob_start_len=-1)" in source
    assert source.count("logprob_start_len") == 2, "a request drawn without logprobs asks for none"

def test_the_client_gets_the_logprobs_the_scheduler_computed():
    lp = _lp()
    meta = {"input_token_logprobs": [[None, 7, None], [-1.0, 8, None], [-2.0, 9, None]],
            "output_token_logprobs": [[-0.5, 11, None], [-0.25, 12, None], [-1.0, 13, None]]}
    assert lc.delivered_violation(lp, meta, output_len=3) is None
    # a stop cut the output at two tokens: the scheduler sends the logprobs of those two
    cut = dict(meta, output_token_logprobs=meta["output_token_logprobs"][:2])
    assert lc.delivered_violation(lp, cut, output_len=2) is None
    resent = dict(meta, input_token_logprobs=meta["input_token_logprobs"] * 2)  # sent again with a later output
    assert "input_token_logprobs holds 6 entries, the scheduler computed 3" in lc.delivered_violation(
        lp, resent, output_len=3)
    other = dict(meta, output_token_logprobs=[[-0.5, 11, None], [-0.75, 12, None], [-1.0, 13, None]])
    assert "output_token_logprobs entry 1 is (-0.75, 12)" in lc.delivered_violation(lp, other, output_len=3)
    assert "not a list" in lc.delivered_violation(lp, {"output_token_logprobs": meta["output_token_logprobs"]},
                                                  output_len=3)
    # a request that ended with no token (max_new_tokens=0): the streamer still sends the prefill's one logprob
    assert lc.delivered_violation(lp, dict(meta, output_token_logprobs=meta["output_token_logprobs"][:1]),
                                  output_len=0) is None
    assert "holds 1 entries, the scheduler computed 0" in lc.delivered_violation(
        lp, dict(meta, output_token_logprobs=meta["output_token_logprobs"][:1]), output_len=0, retracted=True)
    # output logprobs only: the scheduler computed no input logprobs (None), the client gets []
    assert lc.delivered_violation(_lp(input_val=None, input_idx=None), dict(meta, input_token_logprobs=[]),
                                  output_len=3) is None
