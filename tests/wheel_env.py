"""The package as users install it, for the wheel tests of both lanes
(tests/logic/test_wheel.py, tests/server/test_wheel.py): a wheel built from
this checkout, installed into a fresh virtual environment, run from a
directory outside the checkout. The ``wheel`` and ``fresh_env`` fixtures
(conftest.py) call ``build_wheel`` and ``make_fresh_env`` once per session.

The fresh environment reuses the installed SGLang through a ``.pth`` line to
this interpreter's site-packages (line-by-line, so that environment's own
``.pth`` files, among them this checkout's editable install, are not run):
``scripted_runtime`` there can only come from the wheel."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD_TIMEOUT_S = 300
RUN_TIMEOUT_S = 600


def source_copy(dest: Path) -> Path:
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


def run(cmd, *, cwd, timeout=BUILD_TIMEOUT_S, env=None):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def build_wheel(tmp_path_factory) -> Path:
    src = source_copy(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("dist")
    # --no-build-isolation: the build backend (setuptools) comes from this environment, no download
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src), "-w", str(out)],
        cwd=src)
    (built,) = out.glob("scripted_runtime-*.whl")
    return built


def make_fresh_env(wheel: Path, tmp_path_factory) -> Path:
    env_dir = tmp_path_factory.mktemp("venv")
    run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], cwd=env_dir)
    python = env_dir / "bin" / "python"
    purelib = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                       cwd=env_dir).stdout.strip())
    # SGLang and the other dependencies: this environment's site-packages, as a plain path entry
    (purelib / "_reuse_installed_sglang.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel], cwd=env_dir)
    return env_dir


def outside(tmp_path: Path) -> Path:
    work = tmp_path / "elsewhere"
    work.mkdir()
    assert ROOT not in work.resolve().parents
    return work


def env_for(env_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env
