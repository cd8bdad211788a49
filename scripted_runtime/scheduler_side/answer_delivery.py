"""The answer-delivery contract: what the client receives for a request is
what the scheduler emitted for it (scheduler process, at a program's end).

The output oracle and the request-semantics contract judge what the
scheduler holds (``Req.output_ids`` cut at ``finished_len``, the finish
reason). Between that and the client lie SGLang's output path: the
scheduler streams each request's new tokens from its send offset
(``SchedulerOutputStreamer.stream_output``, ``send_token_offset``), and the
tokenizer manager appends every delta to the request's state and answers
``/generate`` with the sum (``TokenizerManager._handle_batch_output``,
``state.output_ids.extend``). A token sent twice, a delta lost, or a
finished request whose last output is never sent changes what the client
gets and nothing the scheduler holds. So, for every request the scheduler
ended:

* an answer arrives (aborted ones included: SGLang answers an abort with
  its finish reason, or an error for a request refused at ingest), within
  ``ANSWER_TIMEOUT_S`` of the program's end, without a further iteration
  (a finished request's last output is sent in the iteration that finished
  it);
* a request that finished (length or stop) gets HTTP 200 whose
  ``output_ids`` are exactly the tokens the scheduler emitted and whose
  ``meta_info.finish_reason.type`` is the scheduler's;
* a streamed one (``stream=True``): SGLang's default answers carry the
  output so far in every event (``incremental_streaming_output`` off), so
  each event's ``output_ids`` extend the previous event's, only the last
  event carries a finish reason, and the last is the answer above.

Aborted requests are only required to get an answer: the tokens an abort
leaves are the oracle's to judge (a prefix of the reference).

Waiting takes no scheduler step (a wall-clock wait on the posts' threads),
so the program's trace does not depend on when the answers land.
"""
from __future__ import annotations

import time
from typing import Any, Iterable, List, Optional, Sequence

from scripted_runtime.hooks import sglang_compat
from scripted_runtime.scheduler_side import check_registry, request_contract

NAME = "answer_delivery"
# Seconds, for all of a program's answers together, from the program's end (an
# answer normally lands within milliseconds of the iteration that sent it).
ANSWER_TIMEOUT_S = 30.0


class AnswerDeliveryError(AssertionError):
    """What a client received for a request is not what the scheduler emitted."""


def _reason_type(body: Any) -> Any:
    reason = ((body or {}).get("meta_info") or {}).get("finish_reason") if isinstance(body, dict) else None
    return reason.get("type") if isinstance(reason, dict) else reason


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    return next((k for k in range(n) if a[k] != b[k]), n)


def stream_violation(chunks: Sequence[Any]) -> Optional[str]:
    """What is wrong with a streamed answer's events, or None: each event's
    ``output_ids`` extend the previous one's, and only the last carries a
    finish reason. Pure."""
    if not chunks:
        return "a streamed answer with no event"
    before: List[int] = []
    for i, chunk in enumerate(chunks):
        if not isinstance(chunk, dict) or not isinstance(chunk.get("output_ids"), list):
            return f"stream event {i} of {len(chunks)} holds no output_ids: {str(chunk)[:200]}"
        ids = chunk["output_ids"]
        if ids[:len(before)] != before:
            k = _first_difference(before, ids)
            return (f"stream event {i} of {len(chunks)} does not extend the one before it: "
                    f"{ids} after {before} (they differ at position {k})")
        last = i == len(chunks) - 1
        if (_reason_type(chunk) is not None) != last:
            return (f"stream event {i} of {len(chunks)} {'has no' if last else 'has a'} finish reason "
                    f"({_reason_type(chunk)!r})")
        before = list(ids)
    return None


def violation(emitted: dict, *, status: Optional[int], body: Any, error: Optional[str],
              chunks: Optional[Sequence[Any]], logprobs: Optional[dict] = None) -> Optional[str]:
    """What is wrong with the answer to a request that finished (length or
    stop) given what the scheduler ``emitted`` for it
    (``request_contract.answer_of``) and, for a ``return_logprob`` request,
    the logprobs it computed (``logprobs``: ``sglang_compat.request_logprobs``),
    or None. Pure."""
    if error is not None:
        return f"the /generate post failed: {error}"
    if status != 200:
        return f"the answer is HTTP {status}: {str(body)[:200]}"
    if not isinstance(body, dict) or not isinstance(body.get("output_ids"), list):
        return f"the answer holds no output_ids: {str(body)[:200]}"
    got, want = body["output_ids"], emitted["output_ids"]
    if got != want:
        k = _first_difference(got, want)
        return (f"the answer's output_ids {got} ({len(got)} tokens) are not the {len(want)} tokens the "
                f"scheduler emitted {want} (first difference at position {k})")
    got_reason, want_reason = _reason_type(body), _reason_type(emitted)
    if got_reason != want_reason:
        return f"the answer's finish reason is {got_reason!r}, the scheduler's {want_reason!r}"
    if logprobs is not None:
        # imported here: at module level it would register its end check before the oracle's
        from scripted_runtime.scheduler_side import logprob_contract

        problem = logprob_contract.delivered_violation(logprobs, body.get("meta_info"), output_len=len(want),
                                                       retracted=bool(logprobs.get("retracted")))
        if problem:
            return problem
    if chunks is not None:
        return stream_violation(chunks)
    return None


@check_registry.end_check(NAME, doc="every ended request gets its /generate answer, and a finished one's "
                                    "answer (every event of a streamed one) holds exactly the tokens and "
                                    "finish reason the scheduler emitted, and the logprobs it computed")
def check_answers(handles: Iterable[Any], *, timeout_s: float = ANSWER_TIMEOUT_S,
                  when: str = "the program's end") -> int:
    """Wait (no step) for the answer of every ended request and judge it;
    returns how many answers were compared with what the scheduler emitted.
    Raises ``AnswerDeliveryError`` on the first problem. ``when``: what the
    wait started at, for the message."""
    deadline = time.monotonic() + timeout_s
    compared = 0
    for h in handles:
        status = h.status
        if status not in ("finished", "aborted"):
            continue
        if not h.http.wait(max(0.0, deadline - time.monotonic())):
            req = h.last_req
            emitted = request_contract.answer_of(req) if req is not None else None
            what = ("never seen by the scheduler" if emitted is None else
                    f"{len(emitted['output_ids'])} tokens, finish reason {_reason_type(emitted)!r}")
            raise AnswerDeliveryError(f"request {h.rid} ended {status} in the scheduler ({what}) but no /generate "
                                      f"answer arrived within {timeout_s:.0f}s of {when}")
        if status != "finished":
            continue
        emitted = request_contract.answer_of(h.last_req) if h.last_req is not None else None
        if emitted is None or _reason_type(emitted) == "abort":
            continue
        problem = violation(emitted, status=h.http.status, body=h.http.body, error=h.http.error,
                            chunks=h.http.chunks, logprobs=sglang_compat.request_logprobs(h.last_req))
        if problem:
            raise AnswerDeliveryError(f"request {h.rid}: {problem}")
        compared += 1
    return compared
