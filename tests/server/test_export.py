"""``scripted-runtime export`` under SGLang's own harness on CPU, on the
buggy and the fixed build (slow lane: each run pays that harness's ~65 s
shutdown on CPU, bench/README.md). The pure parts: tests/logic/test_export.py."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHUNKED = "scenarios/chunked_row_reuse.py:chunked_row_reuse"


def _cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "scripted_runtime.user_side.cli", "export", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_exported_test_fails_and_passes_under_sglangs_harness_as_the_original_does(tmp_path):
    """PR 17850 with its fix toggle: the original (``run --no-invariants``:
    the scenario's own check, which is what travels) and the export under
    SGLang's harness both fail with the fix reverted, on the same
    assertion, and both pass on the fixed build."""
    out = tmp_path / "test_chunked_row_reuse.py"
    outcomes = {}
    for reverted in ([], ["pr17850"]):
        flags = [a for f in reverted for a in ("--revert-fix", f)]
        ours = subprocess.run([sys.executable, "-m", "scripted_runtime.user_side.cli", "run", CHUNKED,
                               "--no-overlap", "--no-invariants", *flags],
                              cwd=ROOT, capture_output=True, text=True, timeout=600)
        theirs = _cli(CHUNKED, "-o", str(out), "--no-overlap", "--check", *flags, timeout=900)
        outcomes[tuple(reverted)] = (ours.returncode, theirs.returncode)
        if reverted:
            assert "moved rows between chunks" in ours.stdout, ours.stdout[-2000:]
            assert "moved rows between chunks" in theirs.stdout + theirs.stderr, theirs.stdout[-3000:]
            assert "export check: FAIL" in theirs.stdout
        else:
            assert "export check: PASS" in theirs.stdout, theirs.stdout[-3000:] + theirs.stderr[-3000:]
    assert outcomes == {(): (0, 0), ("pr17850",): (1, 1)}, outcomes
