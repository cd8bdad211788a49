"""Shared helpers for tests that run scripts on the real scheduler, for
loading the benchmarks (``bench/*.py`` are scripts, not a package), and for
tests that register extensions."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_bench(name: str):
    """``bench/NAME.py`` as a module."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def isolate_extensions(mp) -> None:
    """Extension registrations made from here on (through the monkeypatch
    ``mp``) do not leak into the rest of the session."""
    from scripted_runtime import extensions as ext
    from scripted_runtime.scheduler_side import check_registry, windows

    mp.setattr(check_registry, "_extension_windows", {})
    mp.setattr(check_registry, "_extension_checks", {})
    mp.setattr(ext, "_actions", {})
    mp.setattr(ext, "_loaded", [])
    mp.setattr(ext, "_registered", set())
    mp.setattr(windows, "WINDOWS", dict(windows.WINDOWS))


def run_ok(server, script, *args, **kwargs):
    """Run a script and fail the test with the script's traceback if it failed."""
    result = server.run(script, *args, **kwargs)
    assert result.passed, f"{result.summary()}\n{result.traceback}"
    return result
