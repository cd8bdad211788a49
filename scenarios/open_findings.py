"""Open findings (not classified yet), each replayed on a fresh server.

``oom_after_exhaust_kv``: a scheduler crash under the explorer's
KV pressure, met by the pp1-normal request-fuzzing run on 2026-11-26 and
reproduced with its three fuzzed requests and its abort of an unknown rid
taken out (below; action numbers as found), on a fresh server, every run:

  SchedulerCrashed: RuntimeError: Out of memory. Try to lower your batch size.
  Try to allocate 1 tokens. Available full tokens: 1 (...)

from ``alloc_for_extend`` in ``get_new_batch_prefill``: SGLang launches an
extend it cannot allocate while ``explore.exhaust_kv`` holds every free slot
but the room it leaves for the largest admitted request. Without the
``exhaust_kv`` the program passes. Whether SGLang's admission
(``PrefillAdder``) is wrong under memory pressure, or the harness's room rule
(``program.room_for_largest_request``) takes KV a deployment never loses, is
open (docs/known-bugs.md, "Open findings (not classified yet)"). Not a registered bug and not in
any test.

  scripted-runtime run scenarios/open_findings.py:oom_after_exhaust_kv --no-overlap
"""
from scripted_runtime.scheduler_side.explore import program as explore


def oom_after_exhaust_kv(ctx):
    """See the module docstring: crashes on 0.5.23 at pp1-normal in action 11."""
    reqs = []
    # 1. start: 65 tokens of family 0 (2 chunks), 8 new, streamed
    reqs.append(ctx.start_req(input_ids=explore.prompt_ids(0, 65), max_new_tokens=8, ignore_eos=True, temperature=0.0, stream=True))
    # 2. step 4
    yield from ctx.steps(4)
    # 5. step 4
    yield from ctx.steps(4)
    # 6. flush_cache
    yield from explore.flush_cache(ctx)
    # 8. start: 192 tokens of family 0 (3 chunks), 4 new, streamed, EOS ends it
    reqs.append(ctx.start_req(input_ids=explore.prompt_ids(0, 192), max_new_tokens=4, ignore_eos=False, temperature=0.0, stream=True))
    # 10. exhaust KV: hold every free slot but 0 pages, the radix cache evicted first
    yield from explore.exhaust_kv(ctx, 0, evict_cache=True)
    # 11. step 6
    yield from ctx.steps(6)  # <-- FAILS here: SchedulerCrashed: Available full tokens: N (full_available_size=N + full_evictable_size_=N)
    # 12. update_weights_from_disk(flush_cache=False)
    yield from explore.update_weights(ctx, reqs, flush_cache=False)
    # end: every request finishes or is aborted, the engine returns to idle
    return (yield from explore.end_state_checks(ctx, reqs))

