"""The scripts the benches time (bench/compare.py on both harnesses,
bench/decode_gap.py and bench/invariants.py on ours), written once for both.

They use only what both script contexts offer (``ctx.start_req(prompt_len=,
max_new_tokens=, ignore_eos=)`` and ``handle.finished``), so our harness and
SGLang's built-in ``sglang.test.scripted_runtime`` run the same code. The
upstream harness resolves a script as ``module:function`` inside the scheduler
process, so this module must import without the rest of the bench (the bench
puts ``bench/`` on the server's PYTHONPATH). Results go to a JSON file: the
upstream harness returns nothing from a script.
"""
from __future__ import annotations

import json
import time

# How our harness runs the decode script in the benches: invariants off and no
# trace; invariants on; what ``scripted-runtime run`` does (invariants and trace).
HARNESS_CONFIGS = {
    "bare": {"invariants": False, "trace": False},
    "invariants": {"invariants": True, "trace": False},
    "default": {"invariants": True, "trace": True},
}

DECODE_PROMPT_LEN = 16
SHORT_PROMPT_LEN = 100  # two 64-token prefill chunks
SHORT_NEW_TOKENS = 2


def decode(ctx, max_new_tokens: int, out_path: str):
    """One request decoding ``max_new_tokens`` tokens; writes steps and the
    wall time from the request's post to its end."""
    t0 = time.monotonic()
    handle = ctx.start_req(prompt_len=DECODE_PROMPT_LEN, max_new_tokens=max_new_tokens, ignore_eos=True)
    steps = 0
    while not handle.finished:
        yield
        steps += 1
    wall_s = time.monotonic() - t0
    with open(out_path, "w") as f:
        json.dump({"steps": steps, "wall_s": wall_s, "tokens": max_new_tokens}, f)


def short(ctx):
    """The per-script overhead probe: a chunked prefill and two tokens."""
    handle = ctx.start_req(prompt_len=SHORT_PROMPT_LEN, max_new_tokens=SHORT_NEW_TOKENS, ignore_eos=True)
    while not handle.finished:
        yield


if __name__ == "__main__":
    print(__doc__)
