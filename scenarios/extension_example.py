"""An extension module: a window, an invariant and an explorer action of
your own, without editing the harness (docs/extensions.md).

Load it with ``--extension scenarios/extension_example.py`` (``run``,
``explore``; the pytest plugin's ``--scripted-runtime-extension`` or its
marker's ``extensions=[...]``). It is imported in the harness and in every
scheduler rank, so keep its top level light: SGLang and the harness's
scheduler-side modules are imported inside the functions.

The scenarios at the end use all three; ``budget_broken`` tampers with a
request on purpose to show the invariant fire.

    scripted-runtime run scenarios/extension_example.py:uses_all_three --no-overlap \\
        --extension scenarios/extension_example.py
"""
from scripted_runtime import extensions as ext


@ext.window(loops=("normal", "overlap", "pp"), source="extension example")
def two_or_more_waiting(scheduler):
    """Two or more requests wait in the queue (admission has a choice to make)."""
    n = len(scheduler.waiting_queue)
    return f"waiting={n}" if n >= 2 else None


@ext.invariant
def output_within_budget(view):
    """No request holds more output tokens than its max_new_tokens: SGLang
    finishes a request by length when it reaches max_new_tokens."""
    for req in view.reqs:
        budget = req.sampling_params.max_new_tokens
        if budget is not None and len(req.output_ids) > budget:
            return f"{req.rid} has {len(req.output_ids)} output tokens, max_new_tokens={budget}"
    return None


@ext.action
def abort_newest_then_step(ctx, reqs):
    """Abort the most recently started live request, then run one iteration."""
    from scripted_runtime.scheduler_side.explore import program as explore

    explore.abort_one(ctx, reqs, -1)
    yield from ctx.steps(1)


# --- scenarios using them ---------------------------------------------------

def uses_all_three(ctx):
    """Three requests at once: wait for the extension window, run the
    extension action in it; the extension invariant is checked throughout."""
    # 150-token prompts, 64-token chunks: while the first is chunking, the others wait
    reqs = [ctx.start_req(prompt_len=150, max_new_tokens=4, ignore_eos=True) for _ in range(3)]
    yield from ctx.wait_for_window("two_or_more_waiting", max_steps=20)
    from scripted_runtime.scheduler_side.explore import program as explore

    yield from explore.extension_action(ctx, reqs, "abort_newest_then_step")
    for r in reqs:
        yield from ctx.wait_finished(r, max_steps=200)
    return [r.status for r in reqs]


def budget_broken(ctx):
    """Lower a running request's max_new_tokens below what it already
    produced (tampering, on purpose): ``output_within_budget`` must fail
    the script at the next iteration."""
    req = ctx.start_req(prompt_len=8, max_new_tokens=8, ignore_eos=True)
    yield from ctx.wait_until(lambda: len(req.output_ids) >= 3, max_steps=50, what="3 output tokens")
    req.req.sampling_params.max_new_tokens = 1
    yield from ctx.steps(3)
