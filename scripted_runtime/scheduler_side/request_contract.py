"""The request-semantics contract: what a finished request's answer must be,
whatever ran beside it (scheduler process, at a program's end).

The output oracle compares tokens with a reference; this compares a
request's answer with its own sampling parameters, so it needs no reference
and holds on every device. SGLang 0.5.23's ``Req.update_finish_state``
(``managers/schedule_batch.py``) decides how a request ends, in this order:
a pending abort (``to_finish``), an out-of-vocabulary token (a ``stop`` on a
string), a stop string, then a stop token or EOS
(``_check_token_based_finish``: skipped entirely under ``ignore_eos``, stop
token ids included), then the length cap (``FINISH_LENGTH`` when
``len(output_ids) >= max_new_tokens``), then a terminated grammar; the
emitted output is cut at the finishing token (``finished_len``).
So what the client is sent (``/generate``'s ``output_ids`` and
``meta_info.finish_reason``, read off the ended ``Req`` as SGLang serializes
it) must satisfy:

* never more than ``max_new_tokens`` tokens;
* ``length`` only with exactly ``max_new_tokens`` tokens;
* fewer tokens only with ``stop`` or ``abort``;
* ``stop`` on a token: not under ``ignore_eos``, the matched token is a stop
  token (``stop_token_ids`` or the model's EOS) and it is the last token;
* no stop token before the last one, and a last token that is a stop token
  (not under ``ignore_eos``) ends the request as ``stop``: nothing is
  emitted after a stop, and a stop is never reported as a length.

and the usage it reports (``meta_info.cached_tokens``): the prompt tokens
served from the prefix cache. ``ScheduleBatch.prepare_for_extend`` adds
``pre_len - already_computed`` at every extend and then sets
``already_computed`` to where the extend ended, "only once on the first
chunk" as its comment says: later chunks of a chunked prompt are the
request's own work, not cache hits. So a request never retracted (a
retraction stains it, ``retracted_stain``, and the count stops) reports
exactly the prefix its first extend started from:

* ``cached_tokens`` equals the first extend's ``pre_len``.

Stop strings need the tokenizer, which the CPU default skips
(``skip_tokenizer_init``; SGLang then refuses a ``stop``). On a server with
one (``--topology pp1-text``), a request with stop strings is also judged by
SGLang's stop-string rule (``stop_strings.py``): it ends, as a ``stop`` with
the first listed string, at the first token whose window (the last
``len(encode(longest stop)) + 1`` output tokens) holds one, and never
otherwise on a string.

The same rules say what a greedy request must output given the tokens its
prompt produces alone (``expected_output``): the output oracle
(``output_oracle.py``) cuts its reference with them, so the two checks
share one reading of ``update_finish_state``.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence

from scripted_runtime.scheduler_side import check_registry, stop_strings

NAME = "request_semantics"


def first_stop(tokens: Sequence[int], *, ignore_eos: bool, stop_tokens: Iterable[int]) -> Optional[int]:
    """The position of the first token that ends a request
    (``_check_token_based_finish``: any stop token or EOS, none at all under
    ``ignore_eos``), or None. Pure."""
    if ignore_eos:
        return None
    stops = set(stop_tokens)
    return next((i for i, t in enumerate(tokens) if t in stops), None)


def expected_output(reference: Sequence[int], *, max_new_tokens: int, ignore_eos: bool,
                    stop_tokens: Iterable[int]) -> List[int]:
    """What a request emits when its model produces ``reference`` (the
    greedy tokens of its prompt run alone, which go on past any stop): cut
    after the first stop token, which is part of the output (SGLang sets
    ``finished_len`` to its position + 1), else at ``max_new_tokens`` (a stop
    token is matched before the length cap, so one at the cap's position is a
    stop). Needs ``len(reference) >= max_new_tokens``. Pure."""
    head = list(reference[:max_new_tokens])
    stop = first_stop(head, ignore_eos=ignore_eos, stop_tokens=stop_tokens)
    return head if stop is None else head[:stop + 1]


def violation(answer: Dict[str, Any], *, max_new_tokens: int, ignore_eos: bool,
              stop_tokens: Iterable[int]) -> Optional[str]:
    """What is wrong with one ``/generate`` answer body, or None. Pure."""
    out: List[int] = list(answer.get("output_ids") or [])
    reason = (answer.get("meta_info") or {}).get("finish_reason") or {}
    if not isinstance(reason, dict):
        return f"finish reason {reason!r} is not an object"
    kind = reason.get("type")
    stops = set(() if ignore_eos else stop_tokens)
    n = len(out)
    if n > max_new_tokens:
        return f"{n} tokens for max_new_tokens={max_new_tokens}"
    if kind == "abort":
        return None
    if kind == "length" and n != max_new_tokens:
        return f"finish reason length with {n} of max_new_tokens={max_new_tokens} tokens"
    if kind not in ("length", "stop"):
        return f"finish reason {reason!r} is none of length, stop, abort"
    early = first_stop(out[:-1], ignore_eos=ignore_eos, stop_tokens=stops)
    if early is not None:
        return f"stop token {out[early]} at position {early} of {n}, yet tokens were emitted after it"
    matched = reason.get("matched")
    if kind == "stop" and isinstance(matched, int):
        if ignore_eos:
            return f"stopped on token {matched} under ignore_eos"
        if matched not in stops:
            return f"stopped on token {matched}, which is no stop token ({sorted(stops)})"
        if not out or out[-1] != matched:
            return f"stopped on token {matched} but the last token is {out[-1] if out else None}"
    if out and out[-1] in stops and kind != "stop":
        return f"the last token {out[-1]} is a stop token, yet the finish reason is {kind}"
    # a stop matched on a string is not judged without the tokenizer (module docstring)
    return None


def cached_tokens_violation(req: Any, first_prefix_len: Optional[int]) -> Optional[str]:
    """What is wrong with an ended request's ``cached_tokens``, or None: it
    must be the prefix its first extend started from (``first_prefix_len``),
    unless it was retracted (SGLang stops counting) or never ran an extend,
    or the release keeps no count. Pure."""
    cached = getattr(req, "cached_tokens", None)
    if first_prefix_len is None or cached is None or getattr(req, "retracted_stain", False):
        return None
    if cached != first_prefix_len:
        return (f"cached_tokens={cached}, but its first extend started from a prefix-cache hit of "
                f"{first_prefix_len} tokens (SGLang counts cached tokens once, at the first chunk)")
    return None


def params_of(handle: Any):
    """(max_new_tokens as the scheduler clamped it, ignore_eos, the stop
    tokens ``_check_token_based_finish`` matches), or None where the rule
    does not apply: no Req seen, or a grammar (a terminated grammar ends a
    request on whatever token it last emitted)."""
    req = handle.last_req
    params = getattr(req, "sampling_params", None) if req is not None else None
    if params is None or getattr(req, "grammar", None) is not None:
        return None
    stops = set(getattr(params, "stop_token_ids", None) or ())
    stops |= set(getattr(req, "eos_token_ids", None) or ())
    tokenizer = getattr(req, "tokenizer", None)
    if tokenizer is not None:  # a server with its tokenizer also stops on these
        if getattr(tokenizer, "eos_token_id", None) is not None:
            stops.add(tokenizer.eos_token_id)
        stops |= set(getattr(tokenizer, "additional_stop_token_ids", None) or ())
    return getattr(params, "max_new_tokens", None), bool(getattr(params, "ignore_eos", False)), stops


def answer_of(req: Any) -> Optional[Dict[str, Any]]:
    """What the client is sent for an ended ``Req``: the emitted tokens (cut
    at ``finished_len``) and the finish reason as SGLang serializes it
    (``BaseFinishReason.to_json``); None while it has not ended."""
    reason = getattr(req, "finished_reason", None)
    if reason is None:
        return None
    out = list(getattr(req, "output_ids", None) or [])
    finished_len = getattr(req, "finished_len", None)
    if finished_len is not None:
        out = out[:finished_len]
    to_json = getattr(reason, "to_json", None)
    return {"output_ids": out, "meta_info": {"finish_reason": to_json() if callable(to_json) else reason}}


def stop_string_violation(req: Any, answer: Dict[str, Any]) -> Optional[str]:
    """What is wrong with an ended request's answer given its stop strings
    (``stop_strings.violation``), judged with the tokenizer its Req holds;
    None without stop strings or a tokenizer."""
    params = getattr(req, "sampling_params", None)
    stops = list(getattr(params, "stop_strs", None) or ())
    tokenizer = getattr(req, "tokenizer", None)
    if not stops or tokenizer is None or getattr(params, "stop_regex_strs", None):
        return None
    decode, encode = stop_strings.codec(tokenizer)
    return stop_strings.violation(answer["output_ids"], answer["meta_info"]["finish_reason"], stops,
                                  decode=decode, encode=encode)


@check_registry.end_check(NAME, doc="every ended request's answer agrees with its own sampling parameters: "
                                    "at most max_new_tokens, length only at the cap, a stop only on a stop "
                                    "token and last, nothing after a stop, ignore_eos honoured; cached_tokens is the "
                                    "first extend's prefix-cache hit")
def check_answers(handles: Iterable[Any]) -> int:
    """Every ended request satisfies the contract, judged on what the
    scheduler emits for it (``answer_of``): read in the iteration the program
    ends, so it takes no step and leaves the program's trace as it was (the
    HTTP answer lands at a wall-clock time). Returns how many were checked;
    raises ``RequestContractError`` on the first violation."""
    checked = 0
    for h in handles:
        if h.status not in ("finished", "aborted"):
            continue
        params = params_of(h)
        body = answer_of(h.last_req) if params is not None else None
        if body is None or params[0] is None:
            continue
        max_new, ignore_eos, stops = params
        problem = violation(body, max_new_tokens=max_new, ignore_eos=ignore_eos, stop_tokens=stops)
        problem = problem or stop_string_violation(h.last_req, body)
        if problem:
            raise RequestContractError(f"request {h.rid}: {problem} (output_ids={body['output_ids']}, "
                                       f"finish_reason={body['meta_info']['finish_reason']})")
        problem = cached_tokens_violation(h.last_req, h.first_prefix_len)
        if problem:
            raise RequestContractError(f"request {h.rid}: {problem}")
        checked += 1
    return checked


class RequestContractError(AssertionError):
    """A request's answer broke its own sampling parameters."""
