"""The scheduler-side script of bench/sensitivity.py: does one corrupted KV
entry change a request's greedy output?

Each case: a reference (the prompt alone, ``NEW_TOKENS`` greedy tokens after
a flush), then the prompt again beside a second request of another prompt
of the same length; once both have their first token (the prefill wrote
every prompt entry, nothing reads it yet), one KV entry of the first
request, position ``p`` of its prompt, is corrupted in every layer (key and
value) by one of ``KINDS``; the run goes on to the end and the case counts
as *seen* when the first request's output differs from the reference.
Case kind ``none`` corrupts nothing: it must never differ (the false-
positive control: the same tokens beside another request as alone).

Runs on a normal-loop topology (pp1-normal): the overlap loop may already
have launched the next decode when the script looks, which reads the entry
before it is corrupted. Writes one JSON line per case to ``out_path``.
"""
from __future__ import annotations

import json
import random

KINDS = ("zero", "other_request", "other_position", "noise", "none")
NEW_TOKENS = 16
LENGTHS = (8, 63, 64, 65, 100, 127, 128, 129, 150, 192)  # the explorer's prompt lengths, 1 left out
VOCAB_LOW = 3  # past the tiny model's special ids (bos 1, eos 2)


def _prompt(rng: random.Random, n: int, vocab: int):
    return [rng.randrange(VOCAB_LOW, vocab) for _ in range(n)]


def _run_alone(ctx, prompt):
    yield from ctx.wait_idle(max_steps=100)
    flush = ctx.flush_cache()
    yield from flush.wait(max_steps=10)
    h = ctx.start_req(input_ids=prompt, max_new_tokens=NEW_TOKENS, ignore_eos=True, temperature=0.0)
    yield from ctx.wait_finished(h, max_steps=400)
    return h.output_ids


def _corrupt(ctx, kind: str, slot: int, source_slot: int, gen) -> None:
    import torch

    pool = ctx.scheduler.token_to_kv_pool_allocator.get_kvcache()
    for layer in range(len(pool.k_buffer)):
        for buf in (pool.k_buffer[layer], pool.v_buffer[layer]):
            if kind == "zero":
                buf[slot] = 0
            elif kind in ("other_request", "other_position"):
                buf[slot] = buf[source_slot].clone()
            elif kind == "noise":
                scale = buf[slot].float().pow(2).mean().sqrt()
                buf[slot] = (torch.randn(buf[slot].shape, generator=gen) * scale).to(buf.dtype)


def kv_sensitivity(ctx, cases: int, seed: int, out_path: str):
    import torch

    from scripted_runtime.scheduler_side import state

    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    vocab = ctx.scheduler.model_config.vocab_size
    req_to_token = ctx.scheduler.req_to_token_pool.req_to_token
    with open(out_path, "w") as out:
        for c in range(cases):
            kind = KINDS[c % len(KINDS)]
            n = rng.choice(LENGTHS)
            first, second = _prompt(rng, n, vocab), _prompt(rng, n, vocab)
            p, q = rng.randrange(n), rng.randrange(n)
            while kind == "other_position" and q == p:
                q = rng.randrange(n)
            reference = yield from _run_alone(ctx, first)
            yield from ctx.wait_idle(max_steps=100)
            flush = ctx.flush_cache()
            yield from flush.wait(max_steps=10)
            ha = ctx.start_req(input_ids=first, max_new_tokens=NEW_TOKENS, ignore_eos=True, temperature=0.0)
            hb = ctx.start_req(input_ids=second, max_new_tokens=NEW_TOKENS, ignore_eos=True, temperature=0.0)
            yield from ctx.wait_until(lambda: len(ha.output_ids) >= 1 and len(hb.output_ids) >= 1,
                                      max_steps=100, what="both prompts prefilled")
            row_a = req_to_token[state.req_pool_idx(ha.req)]
            row_b = req_to_token[state.req_pool_idx(hb.req)]
            slot = int(row_a[p])
            source = int(row_b[p]) if kind == "other_request" else int(row_a[q])
            if kind != "none":
                _corrupt(ctx, kind, slot, source, gen)
            yield from ctx.wait_finished(ha, max_steps=400)
            yield from ctx.wait_finished(hb, max_steps=400)
            output = ha.output_ids
            first_diff = next((i for i, (x, y) in enumerate(zip(output, reference)) if x != y), None)
            out.write(json.dumps({"case": c, "kind": kind, "prompt_len": n, "position": p,
                                  "seen": output != reference, "first_difference": first_diff}) + "\n")
    return cases
