"""``scripted-runtime envs list|prune`` on a cache of small fake
environments (the real ones are ~10 GB): what is listed, what each option
removes, and that an environment in use is never removed."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripted_runtime.user_side.builds import env_cache, envs

ROOT = Path(__file__).resolve().parents[2]
DAY = 86400


def _env(root: Path, name: str, requirement: str, days_ago: float, python: str = "") -> Path:
    env = root / name
    (env / "bin").mkdir(parents=True)
    py = env / "bin" / "python"
    if python:
        py.symlink_to(python)
    else:
        py.write_text("")
    (env / envs.READY).write_text(json.dumps({"requirement": requirement, "sglang_version": "x", "size_gb": 10.5}))
    when = time.time() - days_ago * DAY
    (env / envs.LAST_USED).touch()
    os.utime(env / envs.LAST_USED, (when, when))
    return env


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(envs.ENV_CACHE_VAR, str(tmp_path))
    _env(tmp_path, "sglang-0.5.21", "sglang==0.5.21", 40)
    _env(tmp_path, "sglang-0.5.22", "sglang==0.5.22", 10)
    _env(tmp_path, "sglang-0.5.23", "sglang==0.5.23", 1)
    return tmp_path


def _cli(*args, env_root):
    env = {**os.environ, envs.ENV_CACHE_VAR: str(env_root)}
    return subprocess.run([sys.executable, "-m", "scripted_runtime.user_side.cli", "envs", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)


def test_list_names_spec_size_last_use_and_path(cache):
    proc = _cli("list", env_root=cache)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].startswith("sglang==0.5.23") and "10.5 GB" in lines[1] and "(1 d ago)" in lines[1]
    assert str(cache / "sglang-0.5.21") in lines[3]
    assert lines[-1].startswith("3 environments, 31.5 GB")


def test_prune_keep_and_older_than(cache):
    items = env_cache.entries()
    assert [e.requirement for e in env_cache.plan_prune(items, keep=1)] == ["sglang==0.5.22", "sglang==0.5.21"]
    assert [e.requirement for e in env_cache.plan_prune(items, older_than_days=20)] == ["sglang==0.5.21"]
    proc = _cli("prune", "--older-than", "20", env_root=cache)
    assert proc.returncode == 0 and "freed 10.5 GB" in proc.stdout, proc.stdout + proc.stderr
    assert sorted(p.name for p in cache.iterdir() if p.is_dir()) == ["sglang-0.5.22", "sglang-0.5.23"]


def test_prune_without_a_rule_is_a_usage_error(cache):
    proc = _cli("prune", env_root=cache)
    assert proc.returncode == 2 and "--keep N and/or --older-than DAYS" in proc.stderr
    assert len(list(cache.iterdir())) == 3


def test_an_environment_in_use_is_never_pruned(tmp_path, monkeypatch):
    """A process running the environment's python (here: a sleeping copy of
    this interpreter, linked into the fake environment) keeps it."""
    monkeypatch.setenv(envs.ENV_CACHE_VAR, str(tmp_path))
    busy = _env(tmp_path, "sglang-busy", "sglang==busy", 99)
    (busy / "bin" / "python").unlink()
    exe = busy / "bin" / "python3"
    shutil.copy2(os.path.realpath(sys.executable), exe)
    proc = subprocess.Popen([str(exe), "-c", "import time; time.sleep(60)"],
                            env={**os.environ, "PYTHONHOME": sys.base_prefix})
    try:
        deadline = time.monotonic() + 10
        while not env_cache.in_use(busy) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert f"process {proc.pid} runs its python" == env_cache.in_use(busy)
        assert env_cache.plan_prune(env_cache.entries(), keep=0) == []
        out = _cli("prune", "--keep", "0", env_root=tmp_path)
        assert "keeping" in out.stdout and "in use" in out.stdout and busy.exists()
    finally:
        proc.kill()
        proc.wait()
