"""Shared helpers for tests that run scripts on the real scheduler."""
from __future__ import annotations


def run_ok(server, script, *args, **kwargs):
    """Run a script and fail the test with the script's traceback if it failed."""
    result = server.run(script, *args, **kwargs)
    assert result.passed, f"{result.summary()}\n{result.traceback}"
    return result
