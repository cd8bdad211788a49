"""The logprob contract: what a ``return_logprob`` request's logprobs must be
(scheduler process, at a program's end).

SGLang 0.5.23 returns, for a request posted with ``return_logprob``
(``managers/scheduler_components/logprob_result_processor.py``,
``batch_result_processor.py``, ``output_streamer.py``):

* **output logprobs**: one ``(logprob, token id)`` per output token, appended
  with the token itself (``add_logprob_return_values`` at the prefill,
  ``_apply_decode_logprobs`` at each decode), and sent cut at the emitted
  output (``logprob_end = len(output_ids)``);
* with ``top_logprobs_num=k``, the k best ``(logprob, token id)`` of each
  output position, from the same logits row as the token's own logprob;
* **input logprobs** from ``logprob_start_len`` on (``-1``, the default:
  none; the tokenizer resolves it to the prompt's length): one per prompt
  token ``origin_input_ids[start:]``, the first ``None`` (nothing predicts it
  within the returned range: ``[None] + input_token_logprobs[:-1]``), the
  others the logprob of that token given the tokens before it. A request
  asking for them matches the prefix cache only up to its start
  (``Req.init_next_round_input``), so every one is computed.

So, without any reference (``shape_violation``):

* an output logprob for every emitted token, naming that token;
* a top row per emitted token, best first, whose best is at least the
  token's own logprob, and for a greedy request (the token is the argmax)
  equal to it;
* input logprobs naming exactly ``prompt[start:]``, the first ``None``;
* every value a log-probability: finite, at most 0.

And against the output oracle's reference (the prompt run alone, whose run
also records its logprobs: ``output_oracle._run_alone``;
``value_mismatch``): a greedy request the oracle compared has, at each
output position whose token the oracle compared, the reference's logprob,
and at each prompt position from its start on the reference's input
logprob, within ``TOLERANCE``. Measured on pp1-overlap (2026-11-27,
SGLang 0.5.23, the context-sensitive checkpoint): a chunked prompt's input
logprobs beside other requests equal the alone run's exactly, output
logprobs differ by at most 8e-6 (another batch composition changes float
sums), while two positions' logprobs differ by 0.1 or more; so a value
taken from another request's row or another position shows, and float
noise does not.

A request aborted before its prefill's last chunk has no input logprobs
(SGLang computes them there: None, or [] where the abort's output set the
empty containers), which is not judged; a session turn's start
is SGLang's to override (streaming sessions), so its input logprobs are
judged against its own recorded start.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Optional, Sequence

from scripted_runtime.hooks import sglang_compat
from scripted_runtime.scheduler_side import check_registry
# imported first so their end checks register (and are listed) before this one
from scripted_runtime.scheduler_side import output_oracle, request_contract

NAME = "logprobs"
# Two logprobs of one position differ by at most this across batch compositions (measured 8e-6).
TOLERANCE = 1e-3


class LogprobContractError(AssertionError):
    """A request's logprobs disagree with its tokens, its prompt or its reference."""


def resolved_start(requested: Optional[int], prompt_len: int) -> int:
    """Where a request's input logprobs start: ``logprob_start_len`` as
    posted, SGLang's default (-1 or absent) meaning none (the prompt's
    length). Pure."""
    if requested is None or requested < 0:
        return prompt_len
    return requested


def _bad_value(v: Any) -> bool:
    return not isinstance(v, (int, float)) or math.isnan(v) or v > TOLERANCE or v == math.inf


def shape_violation(lp: Dict[str, Any], *, output: Sequence[int], prompt: Sequence[int],
                    start: Optional[int], greedy: bool, prefilled: bool) -> Optional[str]:
    """What is wrong with one request's logprobs (``sglang_compat.request_logprobs``)
    without a reference, or None. ``output``: the emitted tokens (cut at
    ``finished_len``); ``start``: where its input logprobs start (``resolved_start``),
    None when not judged; ``prefilled``: its prefill ran to the end (a
    finished request), so input logprobs must be there. Pure."""
    n = len(output)
    vals, idx = lp["output_val"], lp["output_idx"]
    if len(vals) < n or len(idx) < n:
        return f"{len(vals)} output logprobs for {n} emitted tokens"
    for k in range(n):
        if idx[k] != output[k]:
            return f"output logprob {k} names token {idx[k]}, the token emitted there is {output[k]}"
        if _bad_value(vals[k]):
            return f"output logprob {k} is {vals[k]!r}, not a log-probability"
    if lp["top_n"] > 0:
        top_val, top_idx = lp["top_val"], lp["top_idx"]
        if len(top_val) < n:
            return f"{len(top_val)} top-logprob rows for {n} emitted tokens"
        for k in range(n):
            row = top_val[k]
            if not row:
                return f"top-logprob row {k} is empty (top_logprobs_num={lp['top_n']})"
            if any(_bad_value(v) for v in row):
                return f"top-logprob row {k} holds {row!r}, not log-probabilities"
            if any(row[i] < row[i + 1] - TOLERANCE for i in range(len(row) - 1)):
                return f"top-logprob row {k} is not best first: {row}"
            if vals[k] > row[0] + TOLERANCE:
                return (f"output token {k} ({output[k]}) has logprob {vals[k]:.6f}, above the best of its "
                        f"top row {row[0]:.6f} (token {top_idx[k][0] if top_idx[k] else None})")
            if greedy and vals[k] < row[0] - TOLERANCE:
                return (f"greedy output token {k} ({output[k]}) has logprob {vals[k]:.6f}, below the best of "
                        f"its top row {row[0]:.6f} (token {top_idx[k][0] if top_idx[k] else None}): greedy "
                        "emits the best")
    in_val, in_idx = lp["input_val"], lp["input_idx"]
    if start is None or (not in_val and not prefilled):
        return None  # ended before its prefill's last chunk (an abort): none computed, or none sent
    want = list(prompt[start:])
    if (in_val is None or in_idx is None) and not want:
        return None  # none asked for: SGLang sends [] for a None (output_streamer), the same answer
    if in_val is None or in_idx is None:
        return f"no input logprobs after its prefill (logprob_start_len={start}, {len(want)} expected)"
    if list(in_idx) != want:
        return (f"input logprobs name {len(in_idx)} tokens {list(in_idx)[:6]}..., the prompt from "
                f"logprob_start_len={start} has {len(want)}: {want[:6]}...")
    if len(in_val) != len(want):
        return f"{len(in_val)} input logprob values for {len(want)} prompt tokens from {start}"
    if in_val and in_val[0] is not None:
        return f"the first input logprob (token {start}) is {in_val[0]!r}, not None"
    for j, v in enumerate(in_val[1:], 1):
        if _bad_value(v):
            return f"input logprob of prompt token {start + j} is {v!r}, not a log-probability"
    return None


def value_mismatch(lp: Dict[str, Any], *, output: Sequence[int], compared: int, start: Optional[int],
                   reference: Dict[str, List[Optional[float]]]) -> Optional[str]:
    """What differs between one request's logprobs and its reference's, or
    None. ``compared``: how many of its output tokens the output oracle
    compared equal to the reference's (their logprobs must match too);
    ``reference``: the alone run's ``{"input": [None, ...] per prompt token,
    "output": [...] per output token}``; ``start``: where the request's
    input logprobs start (None: not judged). Pure."""
    ref_out = reference.get("output") or []
    vals = lp["output_val"]
    for k in range(min(compared, len(output), len(vals), len(ref_out))):
        if ref_out[k] is not None and abs(vals[k] - ref_out[k]) > TOLERANCE:
            return (f"output token {k} ({output[k]}) has logprob {vals[k]:.6f}, the same token of the prompt "
                    f"run alone {ref_out[k]:.6f}")
    ref_in = reference.get("input") or []
    in_val = lp["input_val"]
    if start is None or not in_val:
        return None
    for j in range(1, len(in_val)):
        p = start + j
        if p >= len(ref_in) or ref_in[p] is None or in_val[j] is None:
            continue
        if abs(in_val[j] - ref_in[p]) > TOLERANCE:
            return (f"input logprob of prompt token {p} is {in_val[j]:.6f}, the prompt run alone gives "
                    f"{ref_in[p]:.6f}")
    return None


def _pairs(rows: Any) -> Optional[List[tuple]]:
    """``meta_info``'s ``[(logprob, token id, text), ...]`` as (logprob, id) pairs, or None when it is no list."""
    if not isinstance(rows, list):
        return None
    out = []
    for row in rows:
        if not isinstance(row, (list, tuple)) or len(row) < 2:
            return None
        out.append((row[0], row[1]))
    return out


def _same_value(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return isinstance(a, (int, float)) and abs(a - b) <= 1e-6


def delivered_violation(lp: Dict[str, Any], meta_info: Any, *, output_len: int,
                        retracted: bool = False) -> Optional[str]:
    """What differs between the logprobs a finished request's client got
    (its answer's ``meta_info``: ``input_token_logprobs`` and
    ``output_token_logprobs``, ``(logprob, token id, text)`` each, as the
    tokenizer manager appends what the scheduler sent) and what the scheduler
    computed (``lp``, ``sglang_compat.request_logprobs``: the input logprobs
    once, the output logprobs of its ``output_len`` emitted tokens; the
    streamer sends at least one, ``max(len(output_ids), 1)``, unless the
    request was ``retracted``), or None. Pure."""
    info = meta_info if isinstance(meta_info, dict) else {}
    sent = output_len if retracted else max(output_len, 1)
    want_in = list(zip(lp["input_val"] or [], lp["input_idx"] or []))
    want_out = list(zip(lp["output_val"][:sent], lp["output_idx"][:sent]))
    for name, want in (("input_token_logprobs", want_in), ("output_token_logprobs", want_out)):
        got = _pairs(info.get(name))
        if got is None:
            return f"the answer's {name} is {str(info.get(name))[:120]}, not a list of (logprob, token) entries"
        if len(got) != len(want):
            return (f"the answer's {name} holds {len(got)} entries, the scheduler computed {len(want)} "
                    f"(first {[g[1] for g in got[:4]]}..., scheduler {[w[1] for w in want[:4]]}...)")
        for k, (g, w) in enumerate(zip(got, want)):
            if g[1] != w[1] or not _same_value(g[0], w[0]):
                return f"the answer's {name} entry {k} is {g}, the scheduler computed {w}"
    return None


def _start_of(h: Any, prompt_len: int, lp: Dict[str, Any]) -> Optional[int]:
    if getattr(h, "expected_prompt", None) is not None:  # a session turn: SGLang may override its start
        start = lp.get("start")
        return start if isinstance(start, int) and 0 <= start <= prompt_len else None
    return resolved_start(getattr(h, "logprob_start_len", None), prompt_len)


@check_registry.end_check(NAME, doc="every return_logprob request's logprobs name its emitted tokens and its "
                                    "prompt from logprob_start_len, a greedy token is its top row's best, every "
                                    "value is a log-probability; a greedy request the output oracle compared "
                                    "has the logprobs of its prompt run alone")
def check_logprobs(handles: Iterable[Any]) -> int:
    """Every ended ``return_logprob`` request satisfies the contract (module
    docstring); the reference values where the output oracle attached the
    reference it compared the request with (``handle.oracle_reference``).
    Returns how many were checked; raises ``LogprobContractError``."""
    checked = 0
    for h in handles:
        if h.status not in ("finished", "aborted"):
            continue
        req = h.last_req
        lp = sglang_compat.request_logprobs(req) if req is not None else None
        if lp is None:
            continue
        answer = request_contract.answer_of(req)
        if answer is None:
            continue  # no finish reason: removed while queued (an abort), never ran; as the request contract
        output = answer["output_ids"]
        prompt = list(getattr(h, "expected_prompt", None) or getattr(req, "origin_input_ids", ()) or ())
        start = _start_of(h, len(prompt), lp)
        greedy = output_oracle.is_greedy(getattr(req, "sampling_params", None))
        problem = shape_violation(lp, output=output, prompt=prompt, start=start, greedy=greedy,
                                  prefilled=h.status == "finished")
        reference = getattr(h, "oracle_reference", None)
        if problem is None and reference is not None and reference.get("logprobs"):
            problem = value_mismatch(lp, output=output, compared=reference["compared"], start=start,
                                     reference=reference["logprobs"])
        if problem:
            raise LogprobContractError(f"request {h.rid} ({len(prompt)}-token prompt, logprob_start_len="
                                       f"{getattr(h, 'logprob_start_len', None)}, {h.status}, {h.finish_reason}, "
                                       f"{len(output)} tokens): {problem}")
        checked += 1
    return checked
