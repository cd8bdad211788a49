"""Torch-profiler start/stop cycles beside streamed requests, with and
without the profile: the control pair of the registered PP bug
``pp_profiler_stop_with_sends_in_flight`` (docs/known-bugs.md; its strict
xfail is ``scenarios/known_bugs.py:pp_profiler_stop_with_sends_in_flight``).

At pp4 on SGLang 0.5.23 (torch 2.14.1, CPU) ``with_profiles`` corrupts the
scheduler's memory within tens to a few thousand iterations (74 to 2,085 so far)
(failed 5 runs of 5): a rank's segmentation fault (its peers report gloo's
closed connection), a forward's KV store with an index like
62997886067213, or the harness's scan reading a length of hundreds of TiB.
``without_profiles`` runs the same rounds with no profile and passes; with
the candidate fix patched in (the built-in workaround ``fence_pp_profiler_stop``,
hooks/workarounds.py), ``with_profiles`` passes (3 of 3).

    scripted-runtime run scenarios/profiler_stress.py:with_profiles --pp 4
    scripted-runtime run scenarios/profiler_stress.py:without_profiles --pp 4
    scripted-runtime run scenarios/profiler_stress.py:with_profiles --pp 4 \
        --patch fence_pp_profiler_stop

Each round: two streamed requests (8 or 48 tokens, 6 new, input logprobs
from token 0), a two-forward CPU profile (``ctx.start_profile(num_steps=2)``:
no stacks, no shapes), then step until both requests and the profile are
done; 60 rounds, then the end-state checks. The rounds are the registered
bug's scenario (``known_bugs.py`` beside this file: a scenario's folder is
on its import path)."""
from known_bugs import pp_profiler_stop_with_sends_in_flight as _rounds

ROUNDS = 60


def with_profiles(ctx):
    return (yield from _rounds(ctx, ROUNDS))


def without_profiles(ctx):
    return (yield from _rounds(ctx, ROUNDS, profile=False))
