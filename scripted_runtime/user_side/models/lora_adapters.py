"""LoRA adapters of the served model, written locally (no hub), for the
LoRA topology (``pp1-lora``) and ``ctx.load_lora_adapter``.

Each adapter is a PEFT folder (``adapter_config.json`` +
``adapter_model.safetensors``) of rank ``RANK`` on ``TARGET_MODULES`` of
every layer, its matrices Gaussian from one seeded generator, scaled so the
adapter moves the attention of the context-sensitive construction enough to
change the greedy output (measured: a six-token prompt's six greedy tokens
all differ from the base model's under adapter ``lora0``), deterministic in
its seed. Written once per model and seed, atomically (the folder name
carries ``VERSION``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict

from scripted_runtime.user_side.models import files as model_files

VERSION = 1
RANK = 4
ALPHA = 8
SCALE = 0.5
TARGET_MODULES = ("q_proj", "v_proj")
# the adapters a LoRA server offers its scripts (name -> seed)
ADAPTERS = {"lora0": 100, "lora1": 101, "lora2": 102}


def adapter_dir(model: str, seed: int) -> Path:
    """The folder of adapter ``seed`` for ``model`` (written once)."""
    import torch
    from safetensors.torch import save_file

    cfg = json.loads(model_files.CONFIGS[model].read_text())
    folder = model_files.models_root() / f"{model}-lora-v{VERSION}-seed{seed}"
    weights, config = folder / "adapter_model.safetensors", folder / "adapter_config.json"
    if weights.exists() and config.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    hidden = cfg["hidden_size"]
    out = {"q_proj": hidden, "v_proj": cfg["num_key_value_heads"] * (hidden // cfg["num_attention_heads"])}
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for module in TARGET_MODULES:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(RANK, hidden, generator=gen) * SCALE
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out[module], RANK, generator=gen) * SCALE
    tmp = folder / f".adapter_model.safetensors.{os.getpid()}"
    save_file(tensors, str(tmp))
    tmp.replace(weights)
    tmp_cfg = folder / f".adapter_config.json.{os.getpid()}"
    tmp_cfg.write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": ALPHA,
        "target_modules": list(TARGET_MODULES), "lora_dropout": 0.0, "bias": "none",
        "base_model_name_or_path": model,
    }))
    tmp_cfg.replace(config)
    return folder


def adapters(model: str) -> Dict[str, str]:
    """Every adapter a LoRA server offers: name -> folder."""
    return {name: str(adapter_dir(model, seed)) for name, seed in ADAPTERS.items()}
