"""The ``admission_budget`` contract: a prefill pass admits no more KV than
it has.

SGLang 0.5.23 admits waiting requests one by one within a prefill pass
(``PrefillAdder.add_one_req``), and its ``PrefillBudget``
(``mem_cache/prefill_budget.py``: "Memory reservations for one prefill
pass ... account for admitted but not yet allocated work") takes a request
only if its extend plus its new tokens (``max_new_tokens`` less what it
already generated, clipped at ``CLIP_MAX_NEW_TOKENS``) plus a page
(``per_req_token_overhead``) is *less than* the free plus evictable KV less
what the pass already reserved: for each request before it, its page-ceiled
extend, a page and its new tokens, and for the running requests their
decode. So, for every prefill launched:

    sum over the requests the pass admitted of (extend + new tokens + page)
        <  free KV + evictable KV as the pass began

(the last request's own check gives it: each earlier one is charged at
least its extend, new tokens and page). It drops the running requests'
reservation, so it holds whatever the running batch holds. Not counted:
the continuing chunked request (SGLang lets a continuation take a chunk
whatever is left, so it always makes progress); a request the pass leaves
chunked is counted with the extend it got and no new tokens (its check
counted its whole prompt and its new tokens).

Not judged (``sglang_compat.admission_unjudged``): budgets that count other
pools or move KV inside the pass (SWA, Mamba, HiCache load-back), priority
preemption (a pass frees the victims' KV), a disabled radix tree.

Breaking it over-admits: the batch's allocation then fails (SGLang's own
"Prefill out of memory") when the extends alone do not fit, and otherwise
decoding runs short of KV the pass had promised, which SGLang's retraction
hides as ordinary memory pressure. The record is taken as the pass returns
(``Driver.after_prefill_pass``, ``run_counters.admitted_in_pass``,
``BatchRecord.admission``).
"""
from __future__ import annotations

from typing import Any, Optional

from scripted_runtime.scheduler_side import check_registry
from scripted_runtime.scheduler_side.check_registry import Violation

NAME = "admission_budget"
DOC = ("a prefill pass admits requests whose extend, new tokens (max_new_tokens less the output so far, as SGLang "
       "clips it) and a page each sum to less than the free plus evictable KV the pass began with; the continuing "
       "chunked request aside (plain single-pool budgets; not with priority preemption or HiCache)")


def over_admitted(admission: Any) -> Optional[str]:
    """What a pass admitted beyond its room, in words; None when it fits."""
    (free, evictable, page), admitted = admission
    need = sum(extend + new + page for _, extend, new in admitted)
    if need < free + evictable:
        return None
    each = ", ".join(f"{rid} ({extend} extend + {new} new + {page} page)" for rid, extend, new in admitted)
    return (f"admitted {each}: {need} KV tokens, while the pass began with {free} free and {evictable} evictable "
            f"({free + evictable}): admission takes a request only if its need is less than what is left after "
            f"charging the ones before it")


@check_registry.contract(NAME, docs={NAME: DOC})
def check(view: Any, memory: Any) -> Optional[Violation]:
    for b in memory.step_inputs.launched_to_judge(memory.admission, NAME):
        if b.admission is None:
            continue
        words = over_admitted(b.admission)
        if words is not None:
            rids = {rid for rid, _, _ in b.admission[1]}
            return Violation(NAME, f"the prefill launched at step {b.step} {words}",
                             view.owner_info([r for r in view.reqs if r.rid in rids]))
    return None
