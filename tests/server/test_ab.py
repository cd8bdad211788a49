"""``ab`` and ``bisect-check`` end to end on the installed SGLang, with a fix
toggle as the second build (the CI-speed form of an A/B), and the PR 17850
scenario proved against its toggle."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from scripted_runtime.user_side import cli


SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
CHUNKED_ROW = f"{SCENARIOS / 'chunked_row_reuse.py'}:chunked_row_reuse"
UPDATE_WEIGHTS = f"{SCENARIOS / 'update_weights_stale_batch.py'}:update_weights_in_window"


def test_ab_catches_pr17850_and_issue14062_with_their_fix_toggles(tmp_path, capsys):
    out = tmp_path / "ab.json"
    reverted = "current+revert=pr17850,issue14062"
    # The crash comes first: the side restarts its server (same toggles) for the next scenario.
    code = cli.main(["ab", UPDATE_WEIGHTS, CHUNKED_ROW, "--a", "current", "--b", reverted,
                     "--json", str(out)])
    table = capsys.readouterr().out
    assert code == 0, table
    reports = json.loads(out.read_text())
    sides = {r["side"]: [(o["status"], o["signature"]) for o in r["outcomes"]] for r in reports}
    # both sides run this interpreter: their servers fork from one template, imported once
    assert [r["template"]["shared"] for r in reports] == [True, True], reports
    assert reports[0]["template"]["pid"] == reports[1]["template"]["pid"], reports
    assert sides["current"] == [("PASS", ""), ("PASS", "")], table
    assert sides[reverted] == [
        ("CRASH", "SchedulerCrashed: AssertionError: Cache flush failed after updating weights"),
        ("FAIL", "InvariantViolation[slot_ownership]"),
    ], table
    assert re.search(r"chunked_row_reuse\.py:chunked_row_reuse\s+\| current\+revert=pr17850,issue14062\s+\| "
                     r"0\.5\.\d+\s+\| FAIL", table), table


@pytest.mark.slow  # ~22 s; the exit-code mapping stays in the default lane (tests/logic/test_builds.py)
def test_bisect_check_says_bad_for_the_reverted_fix_without_invariants(capsys):
    # Without invariants the scenario's own check sees the row change hands.
    code = cli.main(["bisect-check", CHUNKED_ROW, "--sglang", "current+revert=pr17850",
                     "--no-overlap", "--no-invariants"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "bisect-check: FAIL on current+revert=pr17850" in out
    assert "moved rows between chunks" in out and "-> exit 1 (bad)" in out
