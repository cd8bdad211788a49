"""The ``fill_ids`` contract: an admitted request extends from its prompt
followed by its output so far.

SGLang 0.5.23 keeps a request's ``full_untruncated_fill_ids`` "==
origin_input_ids + output_ids" (``Req.refresh_fill_ids``' own docstring),
refreshed by ``init_next_round_input`` whenever the request is admitted: a
fresh request, the next chunk of a chunked one, one resumed after a
retraction (a pause in ``retract`` mode, ``retract_decode`` under KV
pressure, a priority preemption), a session's next turn. The extend reads
its tokens from it (``extend_end`` cuts it), the prefix match runs on it,
and the release's checkpoint inserts it into the radix tree. So, for every
extend launched (``Driver.on_run_batch``, ``BatchRecord.fill_desync``):

    every unfinished request of the batch has fill ids equal to its
    prompt followed by its output

(between admissions the fill ids lag a decoding request's output: SGLang
refreshes them only where it reads them, so only extends are judged).
Broken, a resumed request re-prefills a context that lacks (or doubles) its
own output and decodes on from it; the output oracle sees that only where
it compares the request (not across a weight update), this sees it at the
resume. Not judged: releases without these fields, diffusion LMs (their
fill ids carry a mask block), finished requests.
"""
from __future__ import annotations

from typing import Any, Optional

from scripted_runtime.scheduler_side import check_registry
from scripted_runtime.scheduler_side.check_registry import Violation

NAME = "fill_ids"
DOC = ("every extend launched reads, for each unfinished request in it, fill ids equal to its prompt followed by its "
       "output so far (Req.refresh_fill_ids' invariant, refreshed at each admission: a fresh request, a next chunk, "
       "a resume after a retraction, a session turn)")


def desync_words(desync: Any) -> str:
    """One launched request's fill ids against its prompt and output, in words."""
    rid, n_fill, n_in, n_out, first = desync
    return (f"{rid}'s fill ids hold {n_fill} tokens where its prompt ({n_in}) and output ({n_out}) hold "
            f"{n_in + n_out}, first differing at position {first}")


@check_registry.contract(NAME, docs={NAME: DOC})
def check(view: Any, memory: Any) -> Optional[Violation]:
    for b in memory.step_inputs.launched_to_judge(memory.fill_ids, NAME):
        if b.fill_desync:
            rids = {d[0] for d in b.fill_desync}
            return Violation(NAME, f"the extend launched at step {b.step} reads fill ids that are not the prompt "
                                   f"followed by the output: " + "; ".join(map(desync_words, b.fill_desync))
                             + " (a resumed request re-prefills a context without its own output)",
                             view.owner_info([r for r in view.reqs if r.rid in rids]))
    return None
