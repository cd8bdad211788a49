"""Priority scheduling (``--topology pp1-priority``: ``enable_priority_scheduling``,
three running requests at most, SGLang's preemption threshold 10, higher
values first). The ``priority`` contract judges every prefill; the output
oracle compares each greedy request with the same prompt alone.

    scripted-runtime run scenarios/priority.py:preempt_for_a_better_request --topology pp1-priority
"""
from __future__ import annotations

LONG = 40  # tokens each low-priority request decodes: still running when the better one arrives


def preempt_for_a_better_request(ctx):
    """Three low-priority requests fill the running slots; a request better
    by less than the threshold waits for a slot; one better by more than it
    preempts a running one (retracted: its row and KV released, queued again
    with its output kept) and finishes while the others still decode. Every
    request then finishes with its alone output (the output oracle)."""
    low = [ctx.start_req(input_ids=[5 + 11 * i + j for j in range(24)], max_new_tokens=LONG, ignore_eos=True,
                         temperature=0.0, priority=0) for i in range(3)]
    yield from ctx.wait_until(lambda: all(len(r.output_ids) >= 2 for r in low), max_steps=200,
                              what="three low-priority requests decoding")
    close = ctx.start_req(input_ids=[300 + j for j in range(16)], max_new_tokens=4, ignore_eos=True,
                          temperature=0.0, priority=5)  # better by 5: not past the threshold
    for _ in range(3):
        yield
    assert close.status == "waiting", f"a request better by less than the threshold must wait: {close.status}"
    urgent = ctx.start_req(input_ids=[400 + j for j in range(16)], max_new_tokens=4, ignore_eos=True,
                           temperature=0.0, priority=20)  # better by 20: preempts
    yield from ctx.wait_until(lambda: urgent.status in ("running", "chunking", "finished"), max_steps=20,
                              what="the urgent request admitted")
    preempted = [r for r in low if r.req is not None and getattr(r.req, "retraction_count", 0) > 0]
    assert len(preempted) == 1 and preempted[0].status == "waiting", \
        f"one low-priority request preempted back to the queue: {[(r.rid, r.status) for r in low]}"
    kept = len(preempted[0].output_ids)
    assert kept >= 2, f"a preempted request keeps its output: {kept} tokens"
    yield from ctx.wait_finished(urgent, max_steps=200)
    still_running = [r.rid for r in low if not r.finished]
    assert still_running, "the urgent request finished while the low-priority ones still decoded"
    yield from ctx.wait_finished(*low, close, max_steps=2000)
    return {"preempted": preempted[0].rid, "kept_tokens": kept, "outputs": [len(r.output_ids) for r in low]}
