"""The cross-release A/B lane (``pytest --ab -m ab``): real PyPI releases in
cached environments (scripted_runtime/user_side/builds/envs.py), ~10 GB and ~8 minutes
each to build the first time, reused after."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripted_runtime.user_side import cli

pytestmark = pytest.mark.ab

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
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


def test_explore_finds_pr27446_on_0_5_12_post1_pp4_from_a_cold_start(tmp_path):
    """Issue 5's acceptance: the explorer, never told the window, finds the
    idle-gate violation that precedes the PR 27446 crash, and the written
    scenario fails ``bisect-check`` on that release."""
    import time

    t0 = time.monotonic()
    code = cli.main(["explore", "--sglang", "sglang==0.5.12.post1", "--pp", "4", "--profile", "ci",
                     "--out", str(tmp_path), "--stats-json", str(tmp_path / "stats.json")])
    took = time.monotonic() - t0
    payload = json.loads((tmp_path / "stats.json").read_text())
    assert code == 1, payload
    assert payload["signature"] == "InvariantViolation[idle_gate]"
    assert payload["replay_matches"] is True and payload["determinism_ok"] is True, payload
    assert payload["stats"]["sglang_version"] == "0.5.12.post1"
    assert took < 300, f"took {took:.0f}s (target: under 5 minutes)"
    verdict = cli.main(["bisect-check", f"{payload['scenario_path']}:program", "--sglang", "sglang==0.5.12.post1",
                        "--pp", "4"])
    assert verdict == 1
