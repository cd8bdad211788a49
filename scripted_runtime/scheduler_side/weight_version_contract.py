"""The weight-version contract: which weights made each token a client was
sent (scheduler process, at a program's end).

SGLang labels the weights it serves with a version (``update_weight_version``,
or the ``weight_version`` of a weight update: ``update_weights_from_disk``,
``_from_tensor``, ``_from_distributed``), and an RL trainer reads, per
answer, which version produced which output tokens
(``meta_info.weight_versions``: spans ``{version, start, end}``, and
``meta_info.weight_version``, the last span's). SGLang 0.5.23 builds them
so (``utils/weight_versions.py``; ``Scheduler.record_weight_version_change``;
``SchedulerOutputStreamer``; ``TokenizerManager._handle_batch_output``):

* when the served version changes from ``old``, every live request (in
  flight, the chunked one, the waiting queue: where a retract-mode pause or
  a preemption parks requests with their output) that has output records
  ``(old, len(output_ids))``: its tokens so far were made under ``old``;
* when a request finishes, its spans cover its output, each token under the
  first recorded version whose boundary lies past it, the rest under the
  version served at its finish; runs of one version are one span, and a
  request with no output has one empty span of the version served.

So the harness notes each version change itself, from the served label
before and after every control request the dispatcher hands SGLang, and
the output lengths of the requests it started at that moment
(``RequestTracker.on_version_change``); what every finished request's
``/generate`` answer reports must be exactly the spans that makes. Pure but
for ``check_answers``, which reads the handles and their answers.
"""
from __future__ import annotations

import time
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from scripted_runtime.scheduler_side import check_registry
# imported for the end checks' listed order: those they register come before this one's
from scripted_runtime.scheduler_side import output_oracle, request_contract  # noqa: F401
from scripted_runtime.scheduler_side import logprob_contract, answer_delivery  # noqa: F401

NAME = "weight_versions"
# Seconds, for all of a program's answers together (the answer-delivery check waited already
# where it is on; this bounds the wait where it is off).
ANSWER_TIMEOUT_S = 30.0


class WeightVersionError(AssertionError):
    """A request's answer names the wrong weight versions for its tokens."""


def token_versions(events: Sequence[Tuple[str, int]], finish_version: str, n: int) -> List[str]:
    """The version each of ``n`` output tokens was made under: token ``i``
    under the old version of the first change recorded when the request had
    more than ``i`` tokens, else under ``finish_version``. Pure."""
    out = []
    for i in range(n):
        out.append(next((old for old, had in events if had > i), finish_version))
    return out


def expected_spans(events: Sequence[Tuple[str, int]], finish_version: str, n: int) -> List[Dict[str, Any]]:
    """The ``meta_info.weight_versions`` of a request that finished with
    ``n`` tokens: its tokens' versions, one span per run. Pure."""
    labels = token_versions(events, finish_version, n)
    if not labels:
        return [{"version": finish_version, "start": 0, "end": 0}]
    spans: List[Dict[str, Any]] = []
    for i, version in enumerate(labels):
        if spans and spans[-1]["version"] == version:
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": version, "start": i, "end": i + 1})
    return spans


def violation(meta_info: Any, expected: List[Dict[str, Any]]) -> Optional[str]:
    """What is wrong with an answer's ``meta_info`` given the spans its
    tokens' versions make, or None. Pure."""
    if not isinstance(meta_info, dict):
        return f"the answer holds no meta_info: {str(meta_info)[:200]}"
    got = meta_info.get("weight_versions")
    if got is None:
        return f"the answer reports no weight_versions (its tokens' versions make {expected})"
    got = [dict(span) if isinstance(span, dict) else span for span in got]
    if got != expected:
        return f"the answer reports weight_versions {got}, but its tokens were made under {expected}"
    if meta_info.get("weight_version") != expected[-1]["version"]:
        return (f"the answer reports weight_version {meta_info.get('weight_version')!r}, but its last span is "
                f"{expected[-1]['version']!r}")
    return None


@check_registry.end_check(NAME, doc="every finished request's answer names, in meta_info.weight_versions, the "
                                    "weight version served when each of its tokens was made (the versions the "
                                    "harness saw change while it ran)")
def check_answers(handles: Iterable[Any], *, current_version: Optional[str],
                  timeout_s: float = ANSWER_TIMEOUT_S) -> int:
    """Judge the answer of every request that finished (length or stop)
    with a 200 answer; returns how many. An answer that has not come within
    the deadline, or an abort, is the answer-delivery check's to judge.
    ``current_version``: the version served now. Raises
    ``WeightVersionError`` on the first violation."""
    if current_version is None:
        return 0  # an SGLang without version labels
    deadline = time.monotonic() + timeout_s
    checked = 0
    for h in handles:
        if h.status != "finished":
            continue
        req = h.last_req
        reason = getattr(req, "finished_reason", None) if req is not None else None
        if reason is None or type(reason).__name__ == "FINISH_ABORT":
            continue
        if not h.http.wait(max(0.0, deadline - time.monotonic())) or h.http.status != 200:
            continue
        body = h.http.body
        if not isinstance(body, dict) or not isinstance(body.get("output_ids"), list):
            continue
        events, finish_version = h.weight_version_record
        expected = expected_spans(events, finish_version or current_version, len(body["output_ids"]))
        problem = violation(body.get("meta_info"), expected)
        if problem:
            raise WeightVersionError(f"request {h.rid}: {problem} (version changes seen while it ran: "
                                     f"{[f'{old} at {had} tokens' for old, had in events] or 'none'})")
        checked += 1
    return checked
