"""HiCache (SGLang's hierarchical cache) scenarios, on CPU too
(``hooks/hicache_cpu.py``). Run with HiCache on, with the explorer's
``pp1-hicache`` options (a 400-token device pool, a 481-slot host pool):

    scripted-runtime run scenarios/hicache.py:held_load_read_by_forward \
        --no-overlap --sglang-arg enable_hierarchical_cache=true --sglang-arg hicache_write_policy=write_through \
        --sglang-arg max_total_tokens=400 --sglang-arg hicache_ratio=1.2

``ctx.hicache()`` reads HiCache's state (``scheduler_side/hicache_state.py``);
the windows ``hicache_write_through_pending`` and ``hicache_load_in_progress``
open while a backup or a load is issued and not reaped. On CPU, without a
storage backend, each copy completes where it is issued; the transfer gate
(``ctx.hold_hicache_transfers``, ``hooks/hicache_gate.py``) holds them
pending across iterations, as a GPU's copy streams would, which is what
PR 19177's race needs (``held_load_read_by_forward``).
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


def load_back_window(ctx, prompt_len=150, filler_len=150):
    """The ``hicache_load_in_progress`` window (PR 19177's): a prompt backed
    up to the host, evicted from a small device pool by two fillers, then
    asked for again; its prefix is loaded back for the batch that uses it.
    Needs a device pool the fillers overflow (``pp1-hicache``'s 400 tokens)."""
    yield from _evict_to_host(ctx, prompt_len, filler_len)
    again = ctx.start_req(prompt_len=prompt_len, max_new_tokens=2, ignore_eos=True, prompt_token=1)
    yield from ctx.wait_for_window("hicache_load_in_progress", max_steps=60)
    seen = ctx.hicache()
    # the batch that used the load waits on it (under PP it may sit in an mbs slot, not last_batch)
    assert seen["ongoing_load_back"] >= 1 and seen["consumer_indices"], seen
    yield from ctx.wait_finished(again, max_steps=100)
    return seen


def _evict_to_host(ctx, prompt_len, filler_len):
    """A prompt (token 1) run, backed up, then pushed out of the device pool
    by two fillers (tokens 2 and 3): its KV is on the host only."""
    first = ctx.start_req(prompt_len=prompt_len, max_new_tokens=2, ignore_eos=True, prompt_token=1)
    yield from ctx.wait_finished(first, max_steps=100)
    for token in (2, 3):
        filler = ctx.start_req(prompt_len=filler_len, max_new_tokens=2, ignore_eos=True, prompt_token=token)
        yield from ctx.wait_finished(filler, max_steps=100)


def held_load_read_by_forward(ctx, prompt_len=150, filler_len=150, held_steps=4):
    """PR 19177's race, logically, on CPU: the load-back of a prefix is held
    by the transfer gate, so its copy is still pending when the batches that
    read those slots run. SGLang 0.5.23 orders it: the extend batch carries
    the load's producer index and its attention waits on the load's layer
    event, which copies the held load before the read (the transfer is
    ``waited``); the decode batches after it read copied data while the load
    stays unacknowledged for ``held_steps`` iterations (the window
    ``hicache_load_in_progress`` stays open). The check
    ``hicache_load_before_read`` fires on a forward that reads the held
    slots without that wait (``mut_hicache_forward_skips_load_wait``: a
    CUDA-graph replay, in PR 19177's words). Needs ``pp1-hicache``'s pools
    (the fillers overflow the device pool; the host pool keeps all three)."""
    yield from _evict_to_host(ctx, prompt_len, filler_len)
    ctx.hold_hicache_transfers(loads=True)
    again = ctx.start_req(prompt_len=prompt_len, max_new_tokens=6, ignore_eos=True, prompt_token=1)
    yield from ctx.wait_until(lambda: any(t["kind"] == "load" for t in ctx.hicache_transfers()), max_steps=60,
                              what="a load-back issued for the evicted prefix")
    for _ in range(held_steps):
        yield
        assert ctx.window_open("hicache_load_in_progress"), ctx.hicache()
    loads = [t for t in ctx.hicache_transfers() if t["kind"] == "load"]
    assert loads and all(t["waited"] for t in loads), loads  # the extend batch waited on each
    released = ctx.release_hicache_transfers()
    yield from ctx.wait_finished(again, max_steps=100)
    return {"loads": loads, "released": released}


def held_backup_survives_eviction(ctx, prompt_len=150, filler_len=150):
    """A backup held by the gate keeps its source slots: the finished
    prompt's node is locked while its write-through is pending, so fillers
    that need the room evict other nodes (or wait), never those slots (the
    check ``hicache_transfer_slots``). Needs ``pp1-hicache``'s 400-token
    device pool (prompt and fillers overflow it)."""
    ctx.hold_hicache_transfers(loads=False, backups=True)
    first = ctx.start_req(prompt_len=prompt_len, max_new_tokens=2, ignore_eos=True, prompt_token=1)
    yield from ctx.wait_finished(first, max_steps=100)
    fillers = [ctx.start_req(prompt_len=filler_len, max_new_tokens=2, ignore_eos=True, prompt_token=token)
               for token in (2, 3)]
    yield from ctx.steps(12)
    held = [t for t in ctx.hicache_transfers() if t["kind"] == "backup" and t["state"] == "held"]
    ctx.release_hicache_transfers()
    yield from ctx.wait_finished(*fillers, max_steps=200)
    return {"held_backups_during_fill": len(held)}


def host_eviction_accounted(ctx, prompt_len=192, prompts=4):
    """Host eviction keeps the host pool whole: ``prompts`` distinct prompts
    fill a small host pool (pp1-hicache's: ``--sglang-arg max_total_tokens=400
    --sglang-arg hicache_ratio=1.2``, 481 host slots), so older backups are
    evicted from the host; the check ``hicache_host_accounting`` holds after
    every iteration (every allocated host slot held by exactly one tree
    node)."""
    host_free = []
    for token in range(1, prompts + 1):
        req = ctx.start_req(prompt_len=prompt_len, max_new_tokens=2, ignore_eos=True, prompt_token=token)
        yield from ctx.wait_finished(req, max_steps=100)
        yield from ctx.steps(2)
        host_free.append(ctx.hicache()["host_free"])
    return {"host_free_after_each": host_free, "host_size": ctx.hicache()["host_size"]}
