"""Torch-profiler start/stop cycles beside streamed requests: an open
finding, not a registered bug (docs/known-bugs.md, "Open findings (not classified yet)").

At pp4 on SGLang 0.5.23 (torch 2.14.1, CPU) ``with_profiles`` corrupts the
scheduler's memory within a few hundred to about a thousand iterations: a
forward's KV store gets an index like 62997886067213 for a pool of 8,193
slots (``IndexError`` in ``set_kv_buffer``), or the harness's own scan
reads a length that would take a 459 TiB array. ``without_profiles`` runs
the same rounds with no profile and passes. Two pp4 dev explorations died
of the same cause's other face, a segmentation fault while garbage
collecting, each right after profiler starts and stops, and neither
replayed alone: this program makes the corruption come back.

    scripted-runtime run scenarios/profiler_stress.py:with_profiles --pp 4
    scripted-runtime run scenarios/profiler_stress.py:without_profiles --pp 4

Each round: two streamed requests (8 or 48 tokens, 6 new, input logprobs
from token 0), a two-forward CPU profile (``ctx.start_profile(num_steps=2)``:
no stacks, no shapes), then step until both requests and the profile are
done; 60 rounds, then the end-state checks."""
from scripted_runtime.scheduler_side.explore import program as explore

ROUNDS = 60


def _rounds(ctx, rounds, profile):
    reqs = []
    for i in range(rounds):
        batch = [ctx.start_req(input_ids=explore.prompt_ids(i % 3, 8 + 40 * (i % 2)), max_new_tokens=6,
                               ignore_eos=True, temperature=0.0, stream=True, logprob_start_len=0)
                 for _ in range(2)]
        reqs += batch
        if profile:
            op = ctx.start_profile(num_steps=2)
            yield from op.wait(max_steps=100)
        yield from ctx.wait_until(lambda: all(h.finished for h in batch) and not ctx.profiling,
                                  max_steps=400, what="the round's requests and profile to finish")
    return (yield from explore.end_state_checks(ctx, reqs))


def with_profiles(ctx):
    return (yield from _rounds(ctx, ROUNDS, True))


def without_profiles(ctx):
    return (yield from _rounds(ctx, ROUNDS, False))
