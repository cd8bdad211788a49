"""The RL weight-sync cycle: pause, release the memory, update the weights,
resume, continue, with requests in flight (docs/control-requests.md,
docs/writing-scenarios.md "The RL weight-sync cycle").

    .venv/bin/scripted-runtime run scenarios/rl_weight_sync.py:cycle_with_requests
    .venv/bin/scripted-runtime run scenarios/rl_weight_sync.py:cycle_with_requests --pp 4

On the CPU default the harness emulates what a GPU's memory saver does to
released memory (``scheduler_side/memory_occupation.py``): released KV and
weights are overwritten, so a request that read KV from before the release,
or ran on weights no update loaded, gives a wrong greedy output, which the
output oracle reports at the end.
"""
from scripted_runtime.scheduler_side.explore import program as explore


def cycle_with_requests(ctx, pause_mode="retract", tags="all", gap=1, tensor=False, distributed=False):
    """A request decoding and one mid-chunk when the cycle starts; after it,
    the same prompts again (their prefix was flushed with the KV cache), and
    every greedy output must be its reference's: the ones that ran across
    the update are not compared (their tokens come from both weights), the
    ones sent after it are, against references under the new weights. An
    ``in_place`` pause keeps the batch running: the release is not allowed
    and the update's flush is refused (``success=False``: the weights are
    loaded, the tree keeps KV of the old ones), so the requests after it,
    which hit that KV, are not compared either. ``tensor=True``: the update
    is the trainer's path, the same checkpoint's tensors through
    ``update_weights_from_tensor`` inside a begin/end weight-update session.
    ``distributed=True``: the trainer's broadcast, the harness's trainer rank
    joining a gloo weight-update group with the scheduler and broadcasting
    the checkpoint while ``update_weights_from_distributed`` receives it, in
    such a session (pp=1 only: under PP every stage claims the same rank)."""
    reqs = [
        ctx.start_req(input_ids=explore.prompt_ids(0, 100), max_new_tokens=12, ignore_eos=True, temperature=0.0),
        ctx.start_req(input_ids=explore.prompt_ids(1, 150), max_new_tokens=6, ignore_eos=True, temperature=0.0),
    ]
    yield from ctx.steps(3 * max(1, ctx.pp_loop_size))
    yield from explore.rl_cycle(ctx, reqs, pause_mode=pause_mode, tags=tags, gap=gap, tensor=tensor,
                                 distributed=distributed)
    reqs.append(ctx.start_req(input_ids=explore.prompt_ids(0, 100), max_new_tokens=8, ignore_eos=True,
                              temperature=0.0))
    reqs.append(ctx.start_req(input_ids=explore.prompt_ids(1, 150), max_new_tokens=8, ignore_eos=True,
                              temperature=0.0))
    end = yield from explore.end_state_checks(ctx, reqs)
    update = [op for op in ctx.control_ops if op.name.startswith("update_weights_from_")][-1]
    if update.success:  # flushed: nothing computed under the old weights is left to hit
        assert end["outputs_compared"] >= 2, f"the requests after the cycle were not compared: {end}"
    return end


def release_needs_idle(ctx):
    """SGLang asserts the engine idle in release_memory_occupation (waiting
    requests allowed while paused): sent while a request decodes it would
    kill the scheduler, so ``ctx`` refuses it with the reason, and the same
    release is accepted once a retract pause has emptied the batches."""
    r = ctx.start_req(input_ids=explore.prompt_ids(0, 8), max_new_tokens=20, ignore_eos=True, temperature=0.0)
    yield from ctx.wait_until(lambda: len(r.output_ids) >= 2, max_steps=100, what="two output tokens")
    try:
        ctx.release_memory_occupation()
    except RuntimeError as exc:
        refused = str(exc)
    else:
        raise AssertionError("release_memory_occupation was posted while a request decodes")
    assert "asserts the engine idle" in refused, refused
    pause = ctx.pause_generation("retract")
    yield from pause.wait()
    release = ctx.release_memory_occupation(["kv_cache"])
    yield from release.wait()
    assert ctx.released_memory == ("kv_cache",), ctx.released_memory
    stats = ctx.engine_stats()
    assert stats["tree_tokens"] == 0 and stats["kv_pool_free"] == stats["kv_pool_total"], stats
    resume = ctx.resume_memory_occupation()
    try:  # posted, not processed yet: a second resume of the tag would raise KeyError in SGLang
        ctx.resume_memory_occupation(["kv_cache"])
    except RuntimeError as exc:
        assert "resume posted already" in str(exc), exc
    else:
        raise AssertionError("a second resume of kv_cache was posted behind the first")
    yield from resume.wait()
    ctx.continue_generation()
    yield from ctx.wait_finished(r, max_steps=400)
    assert len(r.output_ids) == 20, r
    return {"refused": refused.split(":")[0], "released": release.processed_step}


def resume_without_update_serves_lost_weights(ctx):
    """Released weights are lost (on a GPU the memory saver unmapped them;
    here the harness overwrote them): resuming them without a weight update
    serves garbage, which SGLang documents (issue 6367: "You have to rebuild
    the weights by update_weights_from_disk"). The harness says so at the
    next reset (its fingerprint names the lost weights), so this scenario
    loads them again itself before it ends."""
    from scripted_runtime.scheduler_side import memory_occupation

    release = ctx.release_memory_occupation(["weights"])
    yield from release.wait()
    assert memory_occupation.weights_lost(ctx.scheduler), "the release's loss of the weights was not emulated"
    resume = ctx.resume_memory_occupation()
    yield from resume.wait()
    assert memory_occupation.weights_lost(ctx.scheduler)
    update = ctx.update_weights_from_disk(await_arrival=True)
    yield from update.wait()
    assert update.http.wait(30) and update.success, update
    assert not memory_occupation.weights_lost(ctx.scheduler), "a weight update did not count as loading them"
    return {"update": update.processed_step}


def release_behind_a_continue(ctx):
    """A continue posted but not processed changes what the release's assert
    sees (the pause lets waiting requests be; the continue ends it): a release
    posted behind it would kill the scheduler, so ``ctx`` does not allow it
    (the explorer's first finding with the cycle, a harness fault, fixed)."""
    reqs = [ctx.start_req(input_ids=explore.prompt_ids(2, 100), max_new_tokens=12, ignore_eos=True,
                          temperature=0.0)]
    yield from ctx.steps(2)
    pause = ctx.pause_generation("retract")
    yield from pause.wait()
    assert ctx.memory_release_allowed, f"paused with only waiting requests: allowed; {ctx.describe()}"
    ctx.continue_generation()
    assert not ctx.memory_release_allowed, "a release behind the continue was allowed"
    assert (yield from explore.release_memory(ctx, "weights")) is None
    return (yield from explore.end_state_checks(ctx, reqs))


def release_after_an_answered_pause(ctx):
    """The cycle's release right behind its pause, with the pause's HTTP
    answer in before the release asks: SGLang's tokenizer answers a retract
    (or in-place) pause, and a continue, as soon as it has sent it on to the
    scheduler, so that answer says nothing about whether the scheduler
    processed it. The release waits until the pause was processed and is
    posted. (It used to count the answered pause as done, find it still
    queued ahead and skip the release: whether a program released then
    depended on which came first, the answer or the script's check; a kill
    table's finding that did not replay on a fresh server.)"""
    reqs = [ctx.start_req(input_ids=explore.prompt_ids(2, 100), max_new_tokens=12, ignore_eos=True,
                          temperature=0.0)]
    yield from ctx.steps(2)
    pause = ctx.pause_generation("retract")
    assert pause.http.wait(30), f"no HTTP answer to the pause within 30 s; state: {ctx.describe()}"
    assert not pause.processed, "the pause was processed without a scheduler iteration"
    release = yield from explore.release_memory(ctx, "kv_cache")
    assert release is not None and release.processed, f"the release was skipped; state: {ctx.describe()}"
    assert pause.processed_step < release.processed_step, (pause.processed_step, release.processed_step)
    assert ctx.released_memory == ("kv_cache",), ctx.released_memory
    yield from explore.resume_memory(ctx, reqs)
    ctx.continue_generation()
    return (yield from explore.end_state_checks(ctx, reqs))


def abort_pause_right_behind_a_new_request(ctx):
    """A request started and a ``pause_generation(abort)`` posted in the same
    step: the request reached the scheduler's socket (not ingested yet) and
    holds SGLang's tokenizer lock, so the tokenizer's pause loop runs a
    second round, whose ``abort_all`` it sends right before its answer.
    ``explore.pause`` takes that one and lets an iteration process it, so
    nothing of the pause is left queued and the release right behind it is
    posted. (It counted such a request as held back and so not in flight,
    and the release raced that ``abort_all``: skipped, refused or posted by
    the clock; met in the pp4 ci exploration's corpus.)"""
    reqs = [ctx.start_req(input_ids=explore.prompt_ids(0, 8), max_new_tokens=12, ignore_eos=True,
                          temperature=0.0)]
    assert reqs[0].status == "posted" and reqs[0].arrived, (reqs[0].status, reqs[0].arrived)
    yield from explore.pause(ctx, reqs, "abort")
    assert not ctx.await_frame("AbortReq", 2.0), f"an abort_all of the pause is still queued; state: {ctx.describe()}"
    release = yield from explore.release_memory(ctx, "kv_cache")
    assert release is not None and release.processed, f"the release was skipped; state: {ctx.describe()}"
    yield from explore.resume_memory(ctx, reqs)
    ctx.continue_generation()
    return (yield from explore.end_state_checks(ctx, reqs))
