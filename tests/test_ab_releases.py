"""The cross-release A/B lane (``pytest --ab -m ab``): real PyPI releases in
cached environments (scripted_runtime/builds/envs.py), ~10 GB and ~8 minutes
each to build the first time, reused after."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripted_runtime import cli

pytestmark = [pytest.mark.ab, pytest.mark.sglang]

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
PP_FLUSH = f"{SCENARIOS / 'pp_flush_inflight.py'}:flush_with_chunk_in_flight"
CHUNKED_ROW = f"{SCENARIOS / 'chunked_row_reuse.py'}:chunked_row_reuse"
UPDATE_WEIGHTS = f"{SCENARIOS / 'update_weights_stale_batch.py'}:update_weights_in_window"


def _ab(tmp_path, *args):
    out = tmp_path / "ab.json"
    code = cli.main(["ab", *args, "--json", str(out)])
    return code, {r["side"]: r for r in json.loads(out.read_text())}


def test_pr27446_fails_on_0_5_12_post1_and_passes_on_0_5_13_pp4(tmp_path):
    code, sides = _ab(tmp_path, PP_FLUSH, "--a", "sglang==0.5.12.post1", "--b", "sglang==0.5.13", "--pp", "4")
    assert code == 0, sides
    old, new = sides["sglang==0.5.12.post1"], sides["sglang==0.5.13"]
    assert old["sglang_version"] == "0.5.12.post1" and new["sglang_version"] == "0.5.13"
    assert old["outcomes"][0]["status"] == "FAIL"
    assert old["outcomes"][0]["signature"] == "InvariantViolation[idle_gate]"
    assert new["outcomes"][0]["status"] == "PASS"


def test_issue14062_crashes_0_5_13_and_is_refused_on_the_installed_release(tmp_path):
    code, sides = _ab(tmp_path, UPDATE_WEIGHTS, "--a", "sglang==0.5.13", "--b", "current")
    assert code == 0, sides
    assert sides["sglang==0.5.13"]["outcomes"][0]["status"] == "CRASH", sides
    assert sides["current"]["outcomes"][0]["status"] == "PASS", sides


def test_pr17850_fails_on_0_5_8_post1_and_passes_on_0_5_9(tmp_path):
    code, sides = _ab(tmp_path, CHUNKED_ROW, "--a", "sglang==0.5.8.post1", "--b", "sglang==0.5.9")
    assert code == 0, sides
    assert sides["sglang==0.5.8.post1"]["outcomes"][0]["signature"] == "InvariantViolation[slot_ownership]"
    assert sides["sglang==0.5.9"]["outcomes"][0]["status"] == "PASS"
