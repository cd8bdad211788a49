"""Weights that make the greedy output depend on every KV entry.

SGLang's dummy weights (uniform in +-1e-3) and a plain ``randn * 0.02``
checkpoint give the tiny model an output that hardly depends on its context:
a request whose KV slots were swapped with another's produced the same
tokens, so the output oracle could not see a KV-content bug. This module
builds a Qwen2 checkpoint (any Qwen2 config: the shapes come from it) whose
greedy continuation is sensitive to every entry of the KV cache, yet keeps a
clear logit margin between the best and the second-best token almost
everywhere (the oracle stops comparing at a token whose reference margin is
below ``output_oracle.MARGIN``, so float noise of other batch compositions
never flips a compared token).

The construction (all matrices Gaussian from one seeded generator, scaled so
every projection of a unit-RMS input has a known spread):

* **Embeddings** centred over the vocabulary and scaled down (``EMBED``):
  the residual stream is dominated by what attention reads, not by the
  current token.
* **Content attention, sharp but not one-hot**: queries and keys are
  projections of the token's state (``QUERY``, ``KEY``: an attention score
  spread of about ``QUERY * KEY``, i.e. weights varying by factors of
  e^4 between positions), so each step weights the context differently and
  a replaced entry changes what a later step reads. A key bias (``KEY_BIAS``)
  makes a zeroed or missing key stand out (it loses the bias every real key
  carries). No query bias: a query bias makes every position of a layer
  attend to the same few relative offsets.
* **Attention output amplified** (``OUTPUT``) so it dominates the residual
  stream; **MLPs with a sharp gate** (``GATE``) mix the heads nonlinearly.
* A plain Gaussian LM head: the argmax over 512 random directions then
  changes when the final state moves by a fraction of its norm.

The scales were chosen on the HF reference implementation of Qwen2 (float32,
eager attention) by the sensitivity of the greedy output to one perturbed
KV entry (zeroed, replaced by another request's entry at the same position,
replaced by a copy of another position, or noise of its own norm; all
layers, keys and values), over random prompts of the explorer's lengths:
0.965 over 397 cases, a random ``randn * 0.02`` checkpoint 0.03 (the figures
measured through SGLang itself are in bench/README.md). A swap of two whole
entries *within one request* is invisible to any attention model (attention
is a function of the set of (key, value) pairs it reads), so it is not a
case.
"""
from __future__ import annotations

import math
from typing import Dict

# Named in the module docstring; changing one changes every reference output
# (the checkpoint folder name carries VERSION so an old file is never reused).
VERSION = 1
EMBED = 0.3
QUERY = 2.0
KEY = 2.0
KEY_BIAS = 4.0
QUERY_BIAS = 0.0  # drawn (and scaled to nothing) so the draw order stays that of the measured model
OUTPUT = 6.0
GATE = 4.0
DOWN = 1.0


def context_sensitive_weights(cfg: Dict, seed: int) -> Dict[str, "object"]:
    """The state dict (name -> float32 tensor) of the construction for a
    Qwen2 config ``cfg``, deterministic in ``seed``."""
    import torch

    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    head_dim = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * head_dim
    gen = torch.Generator().manual_seed(seed)

    def gauss(*shape: int) -> "torch.Tensor":
        return torch.randn(*shape, generator=gen)

    # Drawn in a fixed order (embeddings, head, then each layer): the seed fixes every value.
    embed = gauss(vocab, h)
    embed -= embed.mean(0, keepdim=True)
    embed /= embed.norm(dim=1, keepdim=True) / math.sqrt(h)  # every row unit RMS
    weights = {
        "model.embed_tokens.weight": embed * EMBED,
        "model.norm.weight": torch.ones(h),
    }
    head = gauss(vocab, h) / math.sqrt(h)
    if not cfg.get("tie_word_embeddings"):
        weights["lm_head.weight"] = head
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        weights.update({
            p + "self_attn.q_proj.weight": gauss(h, h) * QUERY / math.sqrt(h),
            p + "self_attn.q_proj.bias": gauss(h) * QUERY_BIAS,
            p + "self_attn.k_proj.weight": gauss(kv, h) * KEY / math.sqrt(h),
            p + "self_attn.k_proj.bias": gauss(kv) * KEY_BIAS,
            p + "self_attn.v_proj.weight": gauss(kv, h) / math.sqrt(h),
            p + "self_attn.v_proj.bias": torch.zeros(kv),
            p + "self_attn.o_proj.weight": gauss(h, h) * OUTPUT / math.sqrt(h),
            p + "mlp.gate_proj.weight": gauss(inter, h) * GATE / math.sqrt(h),
            p + "mlp.up_proj.weight": gauss(inter, h) / math.sqrt(h),
            p + "mlp.down_proj.weight": gauss(h, inter) * DOWN / math.sqrt(inter),
            p + "input_layernorm.weight": torch.ones(h),
            p + "post_attention_layernorm.weight": torch.ones(h),
        })
    return {k: v.float().contiguous() for k, v in weights.items()}
