"""Write a model folder (config.json only, served with load_format="dummy")
and safetensors checkpoints of the same shapes: the context-sensitive
construction (``construction.py``; the CPU default serves seed 0 and its
weight updates load seed 1) or plain random weights (``randn * 0.02``, what
a dummy-weight server's updates load)."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Dict

HERE = Path(__file__).parent
CONFIGS = {"tiny-qwen2": HERE / "tiny-qwen2.json", "qwen2.5-0.5b": HERE / "qwen2.5-0.5b.json"}


def models_root() -> Path:
    root = os.environ.get("SCRIPTED_RUNTIME_MODELS_DIR") or os.path.join(
        tempfile.gettempdir(), "scripted-runtime-models"
    )
    return Path(root)


def model_dir(name: str) -> Path:
    """A folder holding only config.json for the named model (written once)."""
    if name not in CONFIGS:
        raise ValueError(f"unknown model {name!r}; known: {sorted(CONFIGS)}")
    folder = models_root() / name
    write_if_changed(folder, "config.json", CONFIGS[name].read_text())
    return folder


def write_if_changed(folder: Path, name: str, text: str) -> None:
    """``folder/name`` holds ``text`` afterwards: written (through a
    temporary file, so a reader never sees half of it) unless it already
    does."""
    target = folder / name
    if not target.exists() or target.read_text() != text:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{name}.{os.getpid()}"
        tmp.write_text(text)
        tmp.replace(target)


def qwen2_weight_shapes(cfg: Dict) -> Dict[str, tuple]:
    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    head_dim = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * head_dim
    shapes = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,)}
    if not cfg.get("tie_word_embeddings"):
        shapes["lm_head.weight"] = (vocab, h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (h, h), p + "self_attn.q_proj.bias": (h,),
            p + "self_attn.k_proj.weight": (kv, h), p + "self_attn.k_proj.bias": (kv,),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.v_proj.bias": (kv,),
            p + "self_attn.o_proj.weight": (h, h),
            p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        })
    return shapes


# How a checkpoint's weights are made: "context" (construction.py, the CPU default's)
# or "random" (randn * 0.02, the updates of a dummy-weight server: the GPU default).
CONSTRUCTIONS = ("context", "random")


def checkpoint_dir(name: str, seed: int = 0, construction: str = "random") -> Path:
    """A folder with config.json + model.safetensors of ``construction``'s
    weights for ``seed`` (written once, atomically; the folder name carries
    the construction's version, so a changed construction writes a new one)."""
    import torch
    from safetensors.torch import save_file

    if construction not in CONSTRUCTIONS:
        raise ValueError(f"unknown weights construction {construction!r}; known: {list(CONSTRUCTIONS)}")
    if construction == "context":
        from scripted_runtime.user_side.models import construction as context_construction

        folder = models_root() / f"{name}-context-v{context_construction.VERSION}-seed{seed}"
    else:
        folder = models_root() / f"{name}-checkpoint-{seed}"
    weights = folder / "model.safetensors"
    config_text = CONFIGS[name].read_text()
    if weights.exists() and (folder / "config.json").exists() and (folder / "config.json").read_text() == config_text:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    cfg = json.loads(config_text)
    dtype = getattr(torch, cfg.get("torch_dtype", "float32"))
    if construction == "context":
        tensors = {k: v.to(dtype) for k, v in context_construction.context_sensitive_weights(cfg, seed).items()}
    else:
        gen = torch.Generator().manual_seed(seed)
        tensors = {
            k: (torch.randn(shape, generator=gen) * 0.02).to(dtype)
            for k, shape in qwen2_weight_shapes(cfg).items()
        }
    tmp = folder / f".model.safetensors.{os.getpid()}"
    save_file(tensors, str(tmp))
    tmp.replace(weights)
    tmp_cfg = folder / f".config.json.{os.getpid()}"
    tmp_cfg.write_text(config_text)
    tmp_cfg.replace(folder / "config.json")
    return folder


def served_and_update_checkpoints(name: str, load_format: str) -> "tuple":
    """(the folder to serve, or None for the config-only folder; the folder
    ``update_weights_from_disk`` loads by default) for model ``name`` served
    with ``load_format``. A dummy-weight server (the GPU default) serves the
    config and its updates load random weights (seed 0); any other load
    format serves the context-sensitive construction's seed 0 and its
    updates load seed 1, so an update changes every output."""
    if load_format == "dummy":
        return None, checkpoint_dir(name, 0, "random")
    return checkpoint_dir(name, 0, "context"), checkpoint_dir(name, 1, "context")
