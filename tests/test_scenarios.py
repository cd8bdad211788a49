"""The shipped scenarios, run against the real scheduler."""
from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang
SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def test_demo_scenario(server):
    result = server.run(f"{SCENARIOS / 'demo.py'}:chunked_then_decode")
    assert result.passed, result.traceback
    assert result.value == {"chunks": 3, "output_len": 8}


def test_flush_vs_finished_request(server):
    result = server.run(f"{SCENARIOS / 'flush_vs_finished_request.py'}:flush_in_window")
    if server.info["loop_kind"] == "overlap":
        # 0.5.23's overlap loop (skip-finishing-decode) prunes a length-finished
        # request in the iteration that finishes it: the window never opens.
        assert not result.passed
        assert "waited 100 steps for the request finished but not yet pruned" in result.error
    else:
        assert result.passed, result.traceback
        assert "running_batch" in result.value["held_by"]
