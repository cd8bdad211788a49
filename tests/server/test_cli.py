"""The command line against a real SGLang install."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "scripted_runtime.user_side.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_bad_engine_argument_is_a_one_line_usage_error():
    proc = _cli("run", "scenarios/demo.py:chunked_then_decode", "--sglang-arg", "no_such_engine_arg=1")
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [l for l in proc.stderr.splitlines() if l.startswith("scripted-runtime:")]
    assert len(errors) == 1 and "no_such_engine_arg" in errors[0], proc.stderr[-2000:]
