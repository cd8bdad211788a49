"""When a stop string must end a request: SGLang 0.5.23's rule, as a pure
function of the emitted tokens, the stop strings and the tokenizer.

Read off ``managers/schedule_batch.py`` and ``sampling/sampling_params.py``
(non-speculative decoding, no ``stop_regex``):

* the window: ``SamplingParams.normalize`` (run once, in the tokenizer
  manager) sets ``stop_str_max_len`` to the longest stop's
  ``len(tokenizer.encode(stop, add_special_tokens=False))``;
  ``Req._stop_match_tail_len`` looks at ``W = stop_str_max_len + 1`` output
  tokens;
* after every output token, ``Req.update_finish_state`` checks a pending
  abort, an out-of-vocabulary token, then stop strings
  (``_check_str_based_finish``), then stop tokens and EOS, then the length
  cap. ``tail_str`` decodes the last ``min(W, n)`` output ids alone (HF's
  defaults: special tokens' text included), and the first stop string *in
  list order* found in that text ends the request, as
  ``FINISH_MATCHED_STR(matched=stop)``, at the token that completed it
  (``_locate_str_stop_finished_len`` returns ``len(output_ids)`` for one
  new token: the stop string's tokens are part of the output);
* the fallback ``stop in self.decoded_text`` is dead in the scheduler:
  ``Req.decoded_text`` is set to ``""`` and never written there (only the
  empty stop ``""`` matches it, and the tail too).

So an occurrence is seen exactly when, at the token that completes it, it
lies in the text of the last ``W`` output tokens; one spread over more
tokens is missed by design (the ``+ 1`` is slack for real tokenizers, not a
guarantee). The rule the answer must follow: let ``n*`` be the first
``n`` whose window holds a stop. If there is one, the request finished
``stop`` with ``matched`` the first listed stop in that window and emitted
exactly ``n*`` tokens (an abort may come first: it is checked before the
stops, so an aborted request must not have passed a hit before its last
token); if there is none, it did not finish on a stop string.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

Decode = Callable[[Sequence[int]], str]
Encode = Callable[[str], List[int]]


def codec(tokenizer: Any) -> Tuple[Decode, Encode]:
    """(decode, encode) as SGLang uses ``tokenizer`` for stop strings:
    ``tail_str`` decodes with HF's defaults (special tokens' text kept),
    ``normalize`` encodes without special tokens."""
    return (lambda ids: tokenizer.decode(list(ids)),
            lambda text: tokenizer.encode(text, add_special_tokens=False))


def window_len(stops: Sequence[str], encode: Encode) -> int:
    """``W`` of ``Req._stop_match_tail_len`` for one new token. Pure."""
    return max((len(encode(s)) for s in stops), default=0) + 1


def hit_at(ids: Sequence[int], n: int, stops: Sequence[str], decode: Decode, w: int) -> Optional[str]:
    """The stop SGLang reports after the ``n``-th output token: the first
    stop, in list order, in the text of the last ``min(w, n)`` of
    ``ids[:n]``; None. Pure."""
    tail = decode(list(ids[max(0, n - w):n]))
    return next((s for s in stops if s in tail), None)


def first_hit(ids: Sequence[int], stops: Sequence[str], decode: Decode, w: int) -> Tuple[Optional[int], Optional[str]]:
    """(``n*``, the stop it reports) for the first token whose window holds a
    stop, or (None, None). Pure."""
    for n in range(1, len(ids) + 1):
        stop = hit_at(ids, n, stops, decode, w)
        if stop is not None:
            return n, stop
    return None, None


def violation(output_ids: Sequence[int], finish_reason: dict, stops: Sequence[str], *, decode: Decode,
              encode: Encode) -> Optional[str]:
    """What is wrong with a request's emitted tokens and finish reason
    (``meta_info.finish_reason`` as SGLang serializes it) given its stop
    strings, or None. Pure."""
    if not stops:
        return None
    w = window_len(stops, encode)
    n_star, stop = first_hit(output_ids, stops, decode, w)
    n = len(output_ids)
    kind = (finish_reason or {}).get("type")
    matched = (finish_reason or {}).get("matched")
    where = lambda k: f"the text of output tokens {max(0, k - w)}-{k - 1} (a window of {w})"  # noqa: E731
    if kind == "stop" and isinstance(matched, str) and matched not in stops:
        kind = "abort"  # an out-of-vocabulary token ("NaN happened"): checked before the stop strings too
    if kind == "stop" and isinstance(matched, str):
        if n_star is None:
            return f"finished on stop string {matched!r}, which no window of {w} output tokens holds"
        if n_star != n:
            return (f"stop string {stop!r} is in {where(n_star)}, so the request ends with token {n_star - 1}, "
                    f"yet {n} tokens were emitted")
        if stop != matched:
            return f"finished on {matched!r}, but the first stop string listed in {where(n)} is {stop!r}"
        return None
    if kind == "abort":
        if n_star is not None and n_star < n:
            return f"stop string {stop!r} is in {where(n_star)}, yet the request went on to {n} tokens and an abort"
        return None
    if n_star is not None:
        return f"stop string {stop!r} is in {where(n_star)}, yet the request finished {finish_reason}"
    return None
