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


def mutate_table(topology: str, out_dir: Path, *args: str, timeout_s: float = 1800):
    """``scripted-runtime mutate --topology TOPOLOGY ARGS`` in a subprocess,
    its written files under ``out_dir/found``: its rows by mutant name, the
    unmutated baseline asserted clean (else the table is void)."""
    import json
    import subprocess
    import sys

    from scripted_runtime.user_side import mutate

    table = out_dir / "table.json"
    proc = subprocess.run(
        [sys.executable, "-m", "scripted_runtime.user_side.cli", "mutate", "--topology", topology, *args,
         "--out", str(out_dir / "found"), "--json", str(table)],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["mutant"]: r for r in json.loads(table.read_text())["rows"]}
    assert rows[mutate.BASELINE]["status"] == "clean", rows[mutate.BASELINE]
    return rows


def derandomized_draws(strategy, n: int = 1000) -> list:
    """``n`` derandomized draws of a Hypothesis ``strategy``, without
    shrinking: what a grammar test counts shapes over."""
    from hypothesis import HealthCheck, given, settings

    drawn = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(seq):
        drawn.append(seq)

    collect()
    return drawn
