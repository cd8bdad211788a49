"""Build SPECs, cached environments, worktrees and the A/B table (pure logic,
plus git on a throwaway repository; no SGLang server)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scripted_runtime.user_side import cli
from scripted_runtime.user_side.builds import ab, constraints, envs, side, spec, worktrees
from scripted_runtime.hooks import sglang_compat


def _fake_tree(root: Path, version: str = None) -> Path:
    pkg = root / "python" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    if version:
        (pkg / "_version.py").write_text(f"__version__ = version = '{version}'\n")
    return root


def _git_repo(root: Path) -> Path:
    _fake_tree(root)
    run = lambda *a: subprocess.run(["git", "-C", str(root), *a], check=True, capture_output=True)
    run("init", "-q")
    run("-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    run("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "one")
    run("tag", "v0.5.12.post1")
    return root


def test_spec_forms(tmp_path):
    assert spec.parse("current").kind == "current"
    pip = spec.parse("sglang==0.5.12.post1")
    assert (pip.kind, pip.requirement) == ("pip", "sglang==0.5.12.post1")
    tree = _fake_tree(tmp_path / "src")
    src = spec.parse(str(tree))
    assert src.kind == "source" and src.source == (tree / "python").resolve()
    assert spec.parse(str(tree / "python")).source == (tree / "python").resolve()
    reverted = spec.parse("current+revert=pr27446,pr17850")
    assert reverted.kind == "current" and reverted.revert == ("pr27446", "pr17850")


def test_spec_git_revision(tmp_path):
    repo = _git_repo(tmp_path / "repo")
    g = spec.parse(f"{repo}@v0.5.12.post1")
    assert (g.kind, g.repo, g.rev) == ("git", repo.resolve(), "v0.5.12.post1")


@pytest.mark.parametrize("text, message", [
    ("nonsense", "is not a build SPEC"),
    ("torch==2.1", "must install sglang"),
    ("current+revert=", "needs fix names"),
    ("current+revert=pr1", r"unknown fix toggle\(s\) \['pr1'\]"),
])
def test_spec_errors_say_what_is_accepted(text, message):
    with pytest.raises(ValueError, match=message):
        spec.parse(text)


def test_spec_rejects_a_directory_without_sglang(tmp_path):
    with pytest.raises(spec.SpecError, match="no sglang/__init__.py"):
        spec.parse(str(tmp_path))


def test_release_constraints():
    pins = [c.requirement for c in constraints.for_requirement("sglang==0.5.12.post1")]
    assert pins == ["kernels>=0.14.1,<0.15"]
    assert constraints.for_requirement("sglang==0.5.23") == []
    assert constraints.for_requirement("sglang==0.5.9") == []  # transformers 4.57.1: the pin conflicts
    assert constraints.for_requirement("sglang") == []


def test_env_cache_layout_and_ready_marker(tmp_path, monkeypatch):
    monkeypatch.setenv(envs.ENV_CACHE_VAR, str(tmp_path))
    env = envs.env_dir("sglang==0.5.12.post1")
    assert env == tmp_path / "sglang-0.5.12.post1"
    assert envs.ready_info(env) is None
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").symlink_to(sys.executable)
    assert envs.ready_info(env) is None  # no READY: an unfinished build is not reused
    (env / envs.READY).write_text(json.dumps({"sglang_version": "0.5.12.post1"}))
    checked = []
    monkeypatch.setattr(envs, "ensure_harness_requirements", lambda e, progress: checked.append(e))
    lines = []
    assert envs.ensure_env("sglang==0.5.12.post1", progress=lines.append) == env / "bin" / "python"
    assert lines == [f"reusing {env} (sglang 0.5.12.post1)"]
    assert checked == [env]  # a reused environment gets what the harness needs


def test_reused_env_gets_missing_harness_requirements(tmp_path, monkeypatch):
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").symlink_to(sys.executable)
    monkeypatch.setattr(envs, "HARNESS_IMPORTS", ("json", "no_such_module_xyz"))
    monkeypatch.setattr(envs, "HARNESS_REQUIREMENTS", ("json-req", "no-such-module-xyz>=1"))
    ran = []
    monkeypatch.setattr(envs, "_run_logged", lambda cmd, log, **kw: ran.append((cmd, log)))
    said = []
    envs.ensure_harness_requirements(env, progress=said.append)
    assert len(ran) == 1 and ran[0][0][-4:] == ["install", "--progress-bar", "off", "no-such-module-xyz>=1"]
    assert ran[0][1] == env / "build.log"
    assert said and "no-such-module-xyz>=1" in said[0]
    monkeypatch.setattr(envs, "HARNESS_IMPORTS", ("json",))
    monkeypatch.setattr(envs, "HARNESS_REQUIREMENTS", ("json-req",))
    envs.ensure_harness_requirements(env, progress=said.append)
    assert len(ran) == 1  # nothing missing: pip is not run


def test_env_lock_wait_is_bounded(tmp_path):
    import fcntl

    path = tmp_path / ".x.lock"
    with open(path, "w") as held, open(path, "w") as waiting:
        fcntl.flock(held, fcntl.LOCK_EX)
        said = []
        with pytest.raises(envs.EnvBuildError, match=r"waited 0s for the holder .*still locked"):
            envs._lock_within(waiting, 0.0, what="the holder", progress=said.append)


def test_env_build_failure_names_the_log(tmp_path, monkeypatch):
    monkeypatch.setenv(envs.ENV_CACHE_VAR, str(tmp_path))
    monkeypatch.setenv(envs.MIN_FREE_VAR, "0")  # this build fails long before it needs space
    # A requirement pip cannot satisfy offline-or-not: fails fast, reported with the log path.
    with pytest.raises(envs.EnvBuildError, match=r"pip install sglang==0\.0\.0\.nonexistent failed .*build\.log"):
        envs.ensure_env("sglang==0.0.0.nonexistent", progress=lambda line: None, timeout_s=240)
    assert envs.ready_info(envs.env_dir("sglang==0.0.0.nonexistent")) is None


def _cached_env(root: Path, name: str, version: str = None, size_gb: float = None) -> Path:
    env = root / name
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").symlink_to(sys.executable)
    if version:
        (env / envs.READY).write_text(json.dumps({"sglang_version": version, "size_gb": size_gb,
                                                  "built_at": "2026-11-24 10:00:00"}))
    return env


def test_env_build_refused_without_disk_room_lists_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(envs.ENV_CACHE_VAR, str(tmp_path))
    old = _cached_env(tmp_path, "sglang-0.5.9", "0.5.9", 10.4)
    half = _cached_env(tmp_path, "sglang-0.5.8.post1")  # no READY: an unfinished build
    ran = []
    monkeypatch.setattr(envs, "_run_logged", lambda cmd, log, **kw: ran.append(cmd))
    monkeypatch.setenv(envs.MIN_FREE_VAR, "1e9")  # more than any disk has
    with pytest.raises(envs.EnvBuildError) as err:
        envs.ensure_env("sglang==0.5.13", progress=lambda line: None)
    text = str(err.value)
    assert "building the environment for sglang==0.5.13 needs about 1000000000 GB" in text
    assert f"{old} (sglang 0.5.9, 10.4 GB, built 2026-11-24 10:00:00)" in text
    assert f"{half} (unfinished build, " in text
    assert envs.ENV_CACHE_VAR in text and envs.MIN_FREE_VAR in text
    assert ran == [] and not envs.env_dir("sglang==0.5.13").exists()  # refused before pip ran

    monkeypatch.setenv(envs.MIN_FREE_VAR, "0")
    envs.check_free_space("sglang==0.5.13", envs.env_dir("sglang==0.5.13"))  # room: no error
    monkeypatch.setenv(envs.MIN_FREE_VAR, "lots")
    with pytest.raises(envs.EnvBuildError, match=r"SCRIPTED_RUNTIME_ENV_MIN_FREE_GB='lots': expected a number of GB >= 0"):
        envs.min_free_gb()
    monkeypatch.delenv(envs.MIN_FREE_VAR)
    assert envs.min_free_gb() == envs.DEFAULT_MIN_FREE_GB


def test_env_build_that_fills_the_disk_deletes_the_half_install(tmp_path, monkeypatch):
    monkeypatch.setenv(envs.ENV_CACHE_VAR, str(tmp_path))
    monkeypatch.setenv(envs.MIN_FREE_VAR, "0")

    def fake_run(cmd, log, *, label, **kw):
        env = log.parent
        with open(log, "a") as out:  # as _run_logged does
            out.write(f"$ {' '.join(cmd)}\n")
        if label == "venv":
            (env / "bin").mkdir()
            (env / "bin" / "python").symlink_to(sys.executable)
            (env / "lib" / "site-packages" / "torch").mkdir(parents=True)
            return
        raise envs.EnvBuildError(f"{label} failed (exit 1); last lines of {log}:\n"
                                 "ERROR: Could not install packages due to an OSError: "
                                 "[Errno 28] No space left on device")

    monkeypatch.setattr(envs, "_run_logged", fake_run)
    env = envs.env_dir("sglang==0.5.13")
    with pytest.raises(envs.DiskSpaceError, match=r"(?s)filled up while pip installed sglang==0\.5\.13; "
                                                  r"the half-installed environment was deleted.*No space left"):
        envs.ensure_env("sglang==0.5.13", progress=lambda line: None)
    assert sorted(p.name for p in env.iterdir()) == ["build.log"]

    def other_failure(cmd, log, *, label, **kw):
        log.write_text(f"$ {' '.join(cmd)}\n")
        if label == "venv":
            (log.parent / "bin").mkdir()
            return
        raise envs.EnvBuildError(f"{label} failed (exit 1): no matching distribution")

    monkeypatch.setattr(envs, "_run_logged", other_failure)
    with pytest.raises(envs.EnvBuildError, match="no matching distribution$"):
        envs.ensure_env("sglang==0.5.13", progress=lambda line: None)
    assert (env / "bin").is_dir()  # any other failure leaves the build as it was, to look at

    # The log lives on the full disk too, so pip's message can be cut short
    # ("...due to an OSEr", as seen here): a disk left with almost nothing is full.
    import shutil as shutil_module
    real_usage = shutil_module.disk_usage
    monkeypatch.setattr(envs.shutil, "disk_usage",
                        lambda path: real_usage(path)._replace(free=10_000_000))
    with pytest.raises(envs.DiskSpaceError, match="filled up while pip installed"):
        envs.ensure_env("sglang==0.5.13", progress=lambda line: None)
    assert sorted(p.name for p in env.iterdir()) == ["build.log"]


def test_worktree_checkout_is_reused(tmp_path, monkeypatch):
    monkeypatch.setenv(envs.ENV_CACHE_VAR, str(tmp_path / "cache" / "envs"))
    repo = _git_repo(tmp_path / "repo")
    first = worktrees.ensure_worktree(repo, "v0.5.12.post1", progress=lambda line: None)
    assert (first / "python" / "sglang" / "__init__.py").is_file()
    said = []
    assert worktrees.ensure_worktree(repo, "HEAD", progress=said.append) == first
    assert said and said[0].startswith("reusing")
    with pytest.raises(worktrees.WorktreeError, match="rev-parse"):
        worktrees.ensure_worktree(repo, "no-such-rev", progress=lambda line: None)
    worktrees.remove_worktree(repo, first)
    assert not first.exists()


def test_source_tree_version(tmp_path):
    built = _fake_tree(tmp_path / "built", version="0.5.13.dev40")
    assert sglang_compat.source_tree_version(str(built / "python" / "sglang")) == "0.5.13.dev40"
    repo = _git_repo(tmp_path / "repo")
    assert sglang_compat.source_tree_version(str(repo / "python" / "sglang")) == "0.5.12.post1"


def test_sgl_kernel_stub_only_for_old_releases():
    assert sglang_compat.needs_sgl_kernel_stub("0.5.12.post1")
    assert not sglang_compat.needs_sgl_kernel_stub("0.5.13")
    assert not sglang_compat.needs_sgl_kernel_stub("0.5.23")


def _report(side_label, version, *outcomes):
    return side.SideReport(side=side_label, sglang_version=version, start_s=60.0, wall_s=90.0,
                           outcomes=[side.Outcome(side_label, *o) for o in outcomes])


def test_ab_table_and_difference():
    a = _report("sglang==0.5.12.post1", "0.5.12.post1",
                ("/x/scenarios/pp.py:flush", "FAIL", "InvariantViolation[idle_gate]", 3, 2.5))
    b = _report("sglang==0.5.13", "0.5.13", ("/x/scenarios/pp.py:flush", "PASS", "", 40, 6.0))
    table = ab.format_table([a, b])
    lines = table.splitlines()
    cells = lambda line: [c.strip() for c in line.split(" | ")]
    assert cells(lines[0]) == ["scenario", "side", "sglang", "result", "signature", "steps", "time"]
    assert cells(lines[2]) == ["pp.py:flush", "sglang==0.5.12.post1", "0.5.12.post1", "FAIL",
                               "InvariantViolation[idle_gate]", "3", "2.5s"]
    assert cells(lines[3]) == ["pp.py:flush", "sglang==0.5.13", "0.5.13", "PASS", "-", "40", "6.0s"]
    assert ab.differs([a, b])
    assert not ab.differs([a, a])
    long = _report("x@bad", None, ("/x/scenarios/pp.py:flush", "NO-START", "build: " + "y" * 300, 0, 0.0))
    row = ab.format_table([long]).splitlines()[2]
    assert cells(row)[4] == "build: " + "y" * (ab.SIGNATURE_WIDTH - 10) + "..."  # the JSON keeps it whole


def test_side_reports_an_unpreparable_build_as_no_start(tmp_path, monkeypatch):
    monkeypatch.setenv(envs.ENV_CACHE_VAR, str(tmp_path / "envs"))
    repo = _git_repo(tmp_path / "repo")
    bad = spec.parse(f"{repo}@no-such-rev")
    report = side.run_side(bad, ["/x/s.py:f"], progress=lambda line: None)
    assert not report.started
    assert report.outcomes[0].status == "NO-START"
    assert report.outcomes[0].signature.startswith("build: git rev-parse")


def test_a_side_without_disk_for_its_environment_is_an_error_that_aborts_a_bisect(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(envs.ENV_CACHE_VAR, str(tmp_path / "envs"))
    monkeypatch.setenv(envs.MIN_FREE_VAR, "1e9")
    report = side.run_side(spec.parse("sglang==0.5.13"), ["/x/s.py:f"], progress=lambda line: None)
    assert [o.status for o in report.outcomes] == ["ERROR"]
    assert re.fullmatch(r"build: no disk space for sglang==0\.5\.13: [\d.]+ GB free, 1000000000 GB needed",
                        report.outcomes[0].signature), report.outcomes[0].signature
    assert report.started and not report.ran  # ab exits 1 on it

    scenario = Path(__file__).resolve().parents[2] / "scenarios" / "demo.py"
    target = f"{scenario}:{_first_function(scenario)}"
    assert cli.main(["bisect-check", target, "--sglang", "sglang==0.5.13"]) == 255
    assert "-> exit 255 (abort (harness error))" in capsys.readouterr().out
    # the same for the environment source trees run over: a usage-style abort, no traceback
    tree = _fake_tree(tmp_path / "src")
    assert cli.main(["bisect-check", target, "--sglang", str(tree), "--base-env", "sglang==0.5.13"]) == 255
    assert "--base-env sglang==0.5.13: building the environment" in capsys.readouterr().err
    assert cli.main(["ab", target, "--a", "sglang==0.5.13", "--b", "sglang==0.5.12.post1"]) == 1
    table = capsys.readouterr().out
    assert table.count("| ERROR ") == 2, table


def test_bisect_check_exit_codes_for_usage_and_unstartable_builds(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(envs.ENV_CACHE_VAR, str(tmp_path / "envs"))
    scenario = Path(__file__).resolve().parents[2] / "scenarios" / "demo.py"
    assert cli.main(["bisect-check", f"{scenario}:nope", "--sglang", "current"]) == 255
    repo = _git_repo(tmp_path / "repo")
    code = cli.main(["bisect-check", f"{scenario}:{_first_function(scenario)}",
                     "--sglang", f"{repo}@no-such-rev"])
    assert code == 125
    assert "-> exit 125 (skip (build cannot start))" in capsys.readouterr().out


def _first_function(path: Path) -> str:
    import ast

    return next(n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef))
