"""The context-sensitive weights construction and the checkpoints the
servers load (pure logic: torch and safetensors, no SGLang server)."""
from __future__ import annotations

import json

import pytest

from scripted_runtime.user_side.models import construction, files

torch = pytest.importorskip("torch")


@pytest.fixture()
def models_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SCRIPTED_RUNTIME_MODELS_DIR", str(tmp_path))
    return tmp_path


def _cfg(name="tiny-qwen2"):
    return json.loads(files.CONFIGS[name].read_text())


def test_the_construction_has_every_shape_of_the_config_and_is_deterministic_in_its_seed():
    cfg = _cfg()
    a, again, b = (construction.context_sensitive_weights(cfg, s) for s in (0, 0, 1))
    shapes = files.qwen2_weight_shapes(cfg)
    assert {k: tuple(v.shape) for k, v in a.items()} == shapes
    assert all(torch.equal(a[k], again[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], b["model.embed_tokens.weight"])
    assert all(v.dtype == torch.float32 for v in a.values())


def test_embeddings_are_centred_and_the_key_bias_is_on():
    w = construction.context_sensitive_weights(_cfg(), 0)
    emb = w["model.embed_tokens.weight"]
    assert emb.mean(0).abs().max() < 0.02 * construction.EMBED  # centred over the vocabulary (then rows scaled)
    rms = emb.pow(2).mean(1).sqrt()
    assert torch.allclose(rms, torch.full_like(rms, construction.EMBED), rtol=1e-4)
    k_bias = w["model.layers.0.self_attn.k_proj.bias"]
    assert k_bias.std() > construction.KEY_BIAS / 2  # a zeroed key loses it: it stands out


def test_a_dummy_weight_server_serves_the_config_and_updates_to_random_weights(models_dir):
    served, update = files.served_and_update_checkpoints("tiny-qwen2", "dummy")
    assert served is None
    assert update.name == "tiny-qwen2-checkpoint-0" and (update / "model.safetensors").is_file()


def test_the_cpu_default_serves_the_construction_seed_0_and_updates_to_seed_1(models_dir):
    from safetensors.torch import load_file

    served, update = files.served_and_update_checkpoints("tiny-qwen2", "safetensors")
    assert served.name == f"tiny-qwen2-context-v{construction.VERSION}-seed0"
    assert update.name == f"tiny-qwen2-context-v{construction.VERSION}-seed1"
    assert (served / "config.json").read_text() == files.CONFIGS["tiny-qwen2"].read_text()
    on_disk = load_file(str(served / "model.safetensors"))
    built = construction.context_sensitive_weights(_cfg(), 0)
    assert set(on_disk) == set(built) and all(torch.equal(on_disk[k], built[k]) for k in built)
    before = (served / "model.safetensors").stat().st_mtime_ns
    assert files.checkpoint_dir("tiny-qwen2", 0, "context") == served  # written once
    assert (served / "model.safetensors").stat().st_mtime_ns == before


def test_an_unknown_construction_is_refused(models_dir):
    with pytest.raises(ValueError, match="unknown weights construction 'ones'"):
        files.checkpoint_dir("tiny-qwen2", 0, "ones")


def test_the_cpu_default_loads_real_weights_and_the_gpu_default_dummy_ones():
    from scripted_runtime.user_side import engine_config

    assert engine_config.engine_kwargs("cpu")["load_format"] == "safetensors"
    assert engine_config.engine_kwargs("cuda")["load_format"] == "dummy"
