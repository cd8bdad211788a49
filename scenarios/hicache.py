"""HiCache (SGLang's hierarchical cache) scenarios, on CPU too
(``hooks/hicache_cpu.py``). Run with HiCache on:

    scripted-runtime run scenarios/hicache.py:host_pool_holds_backups --no-overlap \
        --sglang-arg enable_hierarchical_cache=true --sglang-arg hicache_write_policy=write_through
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
