"""HiCache (SGLang's hierarchical cache) on the CPU default
(``hooks/hicache_cpu.py``), without a server: the CPU defaults, the
one-line refusal of what cannot run on CPU, the torch stand-in of the
direct copy against a plain reference. On real servers:
tests/server/test_hicache_cpu.py."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scripted_runtime.hooks import hicache_cpu
from scripted_runtime.user_side import engine_config

ROOT = Path(__file__).resolve().parents[2]
HICACHE = {"enable_hierarchical_cache": True}


def test_cpu_defaults_pick_the_direct_layer_first_copy():
    kwargs = engine_config.engine_kwargs("cpu", "pp1-normal", **HICACHE)
    assert kwargs["hicache_io_backend"] == "direct" and kwargs["hicache_mem_layout"] == "layer_first"
    # an explicit host pool: not sized from the box's free memory (found when the suite's other servers ran)
    assert kwargs["hicache_ratio"] == 2
    assert "hicache_ratio" not in engine_config.engine_kwargs("cpu", "pp1-normal", hicache_size=1, **HICACHE)
    assert "hicache_io_backend" not in engine_config.engine_kwargs("cpu", "pp1-normal")
    assert "hicache_io_backend" not in engine_config.engine_kwargs("cuda", "pp1-normal", **HICACHE)


def test_what_cannot_run_on_cpu_is_a_one_line_usage_error():
    proc = subprocess.run(
        [sys.executable, "-m", "scripted_runtime.user_side.cli", "run", "scenarios/demo.py:chunked_then_decode",
         "--sglang-arg", "enable_hierarchical_cache=true", "--sglang-arg", "hicache_io_backend=kernel",
         "--sglang-arg", "hicache_mem_layout=page_first"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1
    assert "hicache_io_backend=kernel" in err and "--sglang-arg hicache_io_backend=direct" in err


def test_the_direct_copy_moves_the_indexed_rows_of_every_layer():
    torch.manual_seed(0)
    src = [torch.randn(10, 2, 4) for _ in range(3)]
    dst = [torch.zeros(12, 2, 4) for _ in range(3)]
    src_idx, dst_idx = torch.tensor([7, 1, 4]), torch.tensor([0, 11, 5])
    hicache_cpu.transfer_kv_direct(src_layers=src, dst_layers=dst, src_indices=src_idx, dst_indices=dst_idx,
                                   page_size=1)
    for s, d in zip(src, dst):
        for i, j in zip(src_idx.tolist(), dst_idx.tolist()):
            assert torch.equal(d[j], s[i])
        untouched = [k for k in range(12) if k not in dst_idx.tolist()]
        assert torch.count_nonzero(d[untouched]) == 0
    with pytest.raises(ValueError, match="2 source layers, 3 destination"):
        hicache_cpu.transfer_kv_direct(src[:2], dst, src_idx, dst_idx)
