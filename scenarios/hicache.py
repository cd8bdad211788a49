"""HiCache (SGLang's hierarchical cache) scenarios, on CPU too
(``hooks/hicache_cpu.py``). Run with HiCache on:

    scripted-runtime run scenarios/hicache.py:host_pool_holds_backups scenarios/hicache.py:load_back_window \
        --no-overlap --sglang-arg enable_hierarchical_cache=true --sglang-arg hicache_write_policy=write_through \
        --sglang-arg max_total_tokens=600

``ctx.hicache()`` reads HiCache's state (``scheduler_side/hicache_state.py``);
the windows ``hicache_write_through_pending`` and ``hicache_load_in_progress``
open while a backup or a load is issued and not reaped. On CPU, without a
storage backend, each copy completes where it is issued, so the load window
is open at the start of the iteration after the batch that waited on it:
PR 19177's physical race (a forward reading rows a load still writes) needs
the transfer gate of issue 26, not done yet.
"""


def _host_pool(ctx):
    controller = getattr(ctx.scheduler.tree_cache, "cache_controller", None)
    if controller is None:
        raise AssertionError("HiCache is off: run with --sglang-arg enable_hierarchical_cache=true")
    return controller.mem_pool_host


def host_pool_holds_backups(ctx, prompt_len=200):
    """A finished request's KV is written through to the host pool: the
    host pool's free slots drop by the backed-up tokens."""
    host = _host_pool(ctx)
    free_before = host.available_size()
    req = ctx.start_req(prompt_len=prompt_len, max_new_tokens=4, ignore_eos=True)
    yield from ctx.wait_finished(req, max_steps=100)
    yield from ctx.wait_until(lambda: host.available_size() < free_before, max_steps=20,
                              what="the prompt's KV backed up in the host pool")
    return {"host_slots_used": free_before - host.available_size(), "host_slots": free_before}


def write_through_window(ctx, prompt_len=200):
    """The ``hicache_write_through_pending`` window: a backup of the
    prompt's KV issued and not reaped yet, seen through ``ctx.hicache()``."""
    req = ctx.start_req(prompt_len=prompt_len, max_new_tokens=4, ignore_eos=True)
    yield from ctx.wait_for_window("hicache_write_through_pending", max_steps=60)
    seen = ctx.hicache()
    assert seen["ongoing_write_through"] >= 1, seen
    yield from ctx.wait_finished(req, max_steps=100)
    return seen


def load_back_window(ctx, prompt_len=200, filler_len=250):
    """The ``hicache_load_in_progress`` window (PR 19177's): a prompt backed
    up to the host, evicted from a small device pool by two fillers, then
    asked for again; its prefix is loaded back for the batch that uses it.
    Needs ``--sglang-arg max_total_tokens=600`` (a device pool the fillers
    overflow)."""
    first = ctx.start_req(prompt_len=prompt_len, max_new_tokens=2, ignore_eos=True, prompt_token=1)
    yield from ctx.wait_finished(first, max_steps=100)
    for token in (2, 3):
        filler = ctx.start_req(prompt_len=filler_len, max_new_tokens=2, ignore_eos=True, prompt_token=token)
        yield from ctx.wait_finished(filler, max_steps=100)
    again = ctx.start_req(prompt_len=prompt_len, max_new_tokens=2, ignore_eos=True, prompt_token=1)
    yield from ctx.wait_for_window("hicache_load_in_progress", max_steps=60)
    seen = ctx.hicache()
    consumer = seen["last_batch_consumer_index"]
    assert seen["ongoing_load_back"] >= 1 and consumer is not None and consumer >= 0, seen
    yield from ctx.wait_finished(again, max_steps=100)
    return seen
