"""One short end-to-end comparison of all four systems on the real SGLang
with bench/compare.py (slow lane: SGLang's own harness takes 60 s to shut
down), and bench/iteration_cost.py's in-scheduler timers on a short decode
(slow lane, like every bench run). The benches' own logic:
tests/logic/test_bench.py."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_compare_runs_all_four_systems_and_prints_the_table():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "compare.py"), "--topologies", "pp1-overlap", "--repeat", "1",
         "--decode-steps", "20", "--decode-runs", "1", "--short-runs", "2", "--paired-rounds", "1"],
        capture_output=True, text=True, timeout=1500, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = {}
    for line in proc.stdout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 11 and cells[0] == "pp1-overlap":
            table[cells[1]] = cells[2:]
    start = table["start to first script (s)"]
    assert all(re.fullmatch(r"\d+\.\d", c) for c in start[:4]), start  # all four systems started
    paired = table["decode tokens/s (20-step script), paired turns, harness invariants + trace, as `run` does"]
    assert all(float(c) > 0 for c in paired[:4]), paired  # all four decoded in turns
    assert table["processes left after the process exited"][:4] == ["0", "0", "0", "0"]
    assert float(table["shutdown (s)"][0]) < 5.0
    assert table["shutdown (s)"][-1].startswith("met"), table["shutdown (s)"]


@pytest.mark.slow
def test_iteration_cost_times_every_piece_inside_the_scheduler():
    """bench/iteration_cost.py's probe wraps the driver's pieces by name: a
    renamed piece fails here, not silently in a later bench run."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "iteration_cost.py"), "--topologies", "pp1-normal",
         "--decode", "20", "--repeat", "1"],
        capture_output=True, text=True, timeout=600, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    pieces = {}
    for line in proc.stdout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and cells[0] == "pp1-normal":
            pieces[cells[1]] = float(cells[2])
    for name in ("default: observer: after_script (all)", "default: check: check_slot_ownership",
                 "default: after_script: trace append (encode + write)", "default: after_script: StateView (scan)",
                 "bare: driver: before_iteration (all)", "default: driver: on_run_batch (batch record)"):
        assert pieces.get(name, 0) > 0, (name, sorted(pieces))
    assert "bare: check: check_slot_ownership" not in pieces  # bare runs no check
