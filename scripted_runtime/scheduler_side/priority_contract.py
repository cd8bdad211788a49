"""The ``priority`` contract: admission and preemption under SGLang's
priority scheduling (``enable_priority_scheduling``), read off 0.5.23
(docs/checks.md, "The priority contract", has the rules with their sources).

Judged per prefill launched, from what admission left (``BatchRecord.
priority_pass``: the launched requests' and the waiting queue's priority,
wait-queue entry time and retracted flag, taken as the forward launched):

* **admission order** (fcfs, the policy priority scheduling defaults to):
  a pass scans the waiting queue sorted by (pref, entry time), pref =
  priority x sign (smaller is better), and stops at the first request it
  cannot take; so no request still waiting has a strictly smaller key than
  a request this prefill admitted. Not counted: the continuing chunked
  request (admitted first whatever its priority) and the pass's preemption
  victims (queued again behind the others, with a new entry time).
* **preemption**: a victim (a request this pass sent back to the queue:
  retracted, queued after the iteration's requests and control requests
  were taken in, ``Driver.after_ingest``) was
  preempted by a request whose pref is smaller by more than the threshold
  (``priority_diff > threshold``), admitted or still waiting; it holds no
  req_to_token row and is not in the prefill it made room for; and no
  victim at all when preemption is off.

Not judged (SGLang's own exceptions, each a false positive otherwise):
passes with LoRA on (a waiting request whose adapter has no slot is
skipped, not a stop), the ``lof`` policy's order (by length), an engine
liveness (budgets only stop a pass, so "the
best request is admitted" does not hold).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from scripted_runtime.hooks import sglang_compat
from scripted_runtime.scheduler_side import check_registry, state
from scripted_runtime.scheduler_side.check_registry import Violation

NAME = "priority"
DOC = ("with priority scheduling on, no request left waiting by a prefill has a better (priority, queue entry) key "
       "than one it admitted; a request preempted was preempted by one better by more than the threshold, holds "
       "no row and is not in that prefill")


@dataclass
class PriorityMemory:
    batch_cursor: int = 0  # batch_log records judged so far
    last_chunked: Optional[str] = None  # the chunked request as the previous prefill left it


def _key(entry: Any, sign: int) -> Any:
    rid, priority, entered, _ = entry
    return (priority * sign, entered)


@check_registry.contract(NAME, docs={NAME: DOC})
def check(view: Any, memory: Any) -> Optional[Violation]:
    mem: PriorityMemory = memory.priority
    inputs = memory.step_inputs
    launched = inputs.launched_since(mem)
    s = view.s
    settings = sglang_compat.priority_settings(s)
    judged = inputs.enabled(NAME) and settings is not None and not sglang_compat.lora_enabled(s)
    for i, b in enumerate(launched):
        if b.mode != "extend":
            continue
        continuing = mem.last_chunked
        mem.last_chunked = b.chunked_rid
        if not judged or b.priority_pass is None:
            continue
        violation = _judge(b, continuing, settings, view, launched[i + 1:])
        if violation is not None:
            return violation
    return None


def _judge(b: Any, continuing: Optional[str], settings: Any, view: Any, later: list) -> Optional[Violation]:
    admitted_entries, waiting_entries, _ = b.priority_pass
    admitted = [e for e in admitted_entries if e[0] != continuing]
    victims = b.preempted()
    victim_rids = {e[0] for e in victims}
    waiting = [e for e in waiting_entries if e[0] not in victim_rids]
    owners = lambda rids: view.owner_info([r for r in view.reqs if r.rid in rids])  # noqa: E731
    if settings.fcfs and admitted and waiting:
        worst = max(admitted, key=lambda e: _key(e, settings.sign))
        best = min(waiting, key=lambda e: _key(e, settings.sign))
        if _key(best, settings.sign) < _key(worst, settings.sign):
            return Violation(
                NAME, f"a prefill launched at step {b.step} admitted {worst[0]} (priority {worst[1]}) while "
                f"{best[0]} (priority {best[1]}, queued {'earlier' if best[2] < worst[2] else 'later'}) stays "
                f"waiting: admission takes the queue in (priority, queue entry) order "
                f"({'low' if settings.sign > 0 else 'high'} values first)", owners({worst[0], best[0]}))
    if victims and not settings.preemption:
        return Violation(NAME, f"a prefill launched at step {b.step} sent {', '.join(sorted(victim_rids))} back to "
                         "the queue, retracted, though priority preemption is off", owners(victim_rids))
    for rid, priority, _, _ in victims:
        better = [e for e in admitted + waiting if (priority - e[1]) * settings.sign > settings.threshold]
        if not better:
            return Violation(
                NAME, f"{rid} (priority {priority}) was preempted by the prefill launched at step {b.step}, but no "
                f"request admitted or waiting is better than it by more than the threshold "
                f"{settings.threshold}", owners({rid}))
        if rid in b.rids:
            return Violation(NAME, f"{rid} was preempted by the prefill launched at step {b.step} and is in it",
                             owners({rid}))
        req = next((r for r in view.reqs if r.rid == rid), None)
        readmitted = any(x.mode == "extend" and rid in x.rids for x in later)  # a new row since: PP slots, overlap
        if req is not None and state.req_pool_idx(req) is not None and not readmitted:
            return Violation(NAME, f"{rid} was preempted by the prefill launched at step {b.step} and still holds "
                             f"req_to_token row {state.req_pool_idx(req)}", owners({rid}))
    return None
