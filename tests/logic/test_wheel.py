"""The package as users install it: a wheel built from this checkout,
installed into a fresh virtual environment, run from a directory outside the
checkout.

The fresh environment reuses the installed SGLang through a ``.pth`` line to
this interpreter's site-packages (line-by-line, so that environment's own
``.pth`` files, among them this checkout's editable install, are not run):
``scripted_runtime`` there can only come from the wheel.

The default lane checks what the wheel holds and that it imports and finds
its run-time files from outside the checkout (seconds); the slow lane runs
the demo scenario, a short exploration and a foreign project's pytest file
with the plugin's ``scripted_server`` fixture (three server starts)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 300
RUN_TIMEOUT_S = 600


def _source_copy(dest: Path) -> Path:
    """The files git would ship (tracked, plus untracked ones it does not
    ignore), copied, so building writes nothing into the checkout."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, check=True, capture_output=True, timeout=60).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def _run(cmd, *, cwd, timeout=BUILD_TIMEOUT_S, env=None):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = _source_copy(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("dist")
    # --no-build-isolation: the build backend (setuptools) comes from this environment, no download
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src), "-w", str(out)],
         cwd=src)
    (built,) = out.glob("scripted_runtime-*.whl")
    return built


@pytest.fixture(scope="module")
def fresh_env(wheel, tmp_path_factory) -> Path:
    env_dir = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], cwd=env_dir)
    python = env_dir / "bin" / "python"
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        cwd=env_dir).stdout.strip())
    # SGLang and the other dependencies: this environment's site-packages, as a plain path entry
    (purelib / "_reuse_installed_sglang.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel], cwd=env_dir)
    return env_dir


def _outside(tmp_path: Path) -> Path:
    work = tmp_path / "elsewhere"
    work.mkdir()
    assert ROOT not in work.resolve().parents
    return work


def _env_for(env_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_the_wheel_installs_only_scripted_runtime_and_carries_its_run_time_files(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"scripted_runtime", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}, top
    for needed in ("scripted_runtime/hooks/__init__.py", "scripted_runtime/hooks/scheduler_hook.py",
                   "scripted_runtime/hooks/_site/sitecustomize.py",
                   "scripted_runtime/user_side/models/tiny-qwen2.json",
                   "scripted_runtime/user_side/models/qwen2.5-0.5b.json"):
        assert needed in names, f"{needed} missing from {wheel.name}"
    sources = [f"scripted_runtime/{p.relative_to(ROOT / 'scripted_runtime').as_posix()}"
               for p in (ROOT / "scripted_runtime").rglob("*.py")]
    sources += [f"scripted_runtime/hooks/{p.relative_to(ROOT / 'hooks').as_posix()}" for p in (ROOT / "hooks").rglob("*.py")]
    missing = sorted(set(sources) - set(names))
    assert not missing, f"modules left out of the wheel (pyproject.toml's packages list): {missing}"
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "scripted-runtime = scripted_runtime.user_side.cli:main" in entry_points
    assert "scripted_runtime = scripted_runtime.pytest_plugin" in entry_points


def test_the_installed_wheel_imports_and_finds_its_files_outside_the_checkout(fresh_env, tmp_path):
    work = _outside(tmp_path)
    probe = textwrap.dedent("""
        import json, scripted_runtime, scripted_runtime.hooks
        from scripted_runtime import module_paths
        from scripted_runtime.user_side.models import files
        print(json.dumps({
            "package": scripted_runtime.__file__,
            "hooks": scripted_runtime.hooks.__file__,
            "site": str(module_paths.site_dir()),
            "path_entry": module_paths.harness_path_entry(),
            "model": str(files.model_dir("tiny-qwen2")),
        }))
    """)
    import json

    out = json.loads(_run([fresh_env / "bin" / "python", "-c", probe], cwd=work, env=_env_for(fresh_env)).stdout)
    for key in ("package", "hooks", "site"):
        assert Path(out[key]).resolve().is_relative_to(fresh_env.resolve()), (key, out)
    assert (Path(out["site"]) / "sitecustomize.py").is_file()
    entry = Path(out["path_entry"])
    assert sorted(p.name for p in entry.iterdir()) == ["scripted_runtime"], "the ranks' PYTHONPATH entry holds only the package"
    assert (Path(out["model"]) / "config.json").is_file()
    help_text = _run([fresh_env / "bin" / "scripted-runtime", "--help"], cwd=work, env=_env_for(fresh_env)).stdout
    assert "explore" in help_text and "run" in help_text
    assert not list(work.iterdir()), "importing and --help wrote nothing in the working directory"


FOREIGN_TEST = '''
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def finishes(ctx):
    req = ctx.start_req(prompt_len=40, max_new_tokens=3, ignore_eos=True)
    yield from ctx.wait_finished(req, max_steps=100)
    return len(req.output_ids)


@pytest.mark.scripted_runtime(pp=1, overlap=True)
def test_finishes(scripted_server):
    result = scripted_server.run(f"{HERE / 'test_foreign.py'}:finishes")
    assert result.passed, result.summary()
    assert result.value == 3
'''


@pytest.mark.slow
@pytest.mark.sglang
def test_the_installed_wheel_runs_the_demo_an_exploration_and_a_foreign_pytest_file(fresh_env, tmp_path):
    work = _outside(tmp_path)
    env = _env_for(fresh_env)
    cli = fresh_env / "bin" / "scripted-runtime"
    shutil.copy(ROOT / "scenarios" / "demo.py", work / "demo.py")

    demo = _run([cli, "run", "demo.py:chunked_then_decode"], cwd=work, env=env, timeout=RUN_TIMEOUT_S)
    assert "PASS" in demo.stdout, demo.stdout

    found = work / "found"
    explored = _run([cli, "explore", "--profile", "ci", "--max-examples", "5", "--database", "none",
                     "--out", found], cwd=work, env=env, timeout=RUN_TIMEOUT_S)
    assert re.search(r"explored pp1-overlap \(sglang [^)]+\): \d+ programs", explored.stdout), explored.stdout

    project = work / "project"
    project.mkdir()
    (project / "test_foreign.py").write_text(FOREIGN_TEST)
    ran = _run([fresh_env / "bin" / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_foreign.py"],
               cwd=project, env=env, timeout=RUN_TIMEOUT_S)
    assert "1 passed" in ran.stdout, ran.stdout

    written = sorted(p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file())
    stray = [p for p in written if not p.startswith(("found/", "project/")) and p != "demo.py"]
    assert not stray, f"files written outside --out and the project: {stray}"
