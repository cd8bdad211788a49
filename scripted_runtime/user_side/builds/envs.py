"""Cached virtual environments, one per pip requirement (``sglang==X``).

Each SGLang release pins its own torch/transformers/... so two releases cannot
share an environment (docs/sglang-facts.md, "Running on CPU"). An environment
is built once under the cache root (``$SCRIPTED_RUNTIME_ENV_CACHE``, default
``~/.cache/scripted-runtime/envs``) and reused: a ``READY`` file written after
a successful build and import check marks it usable. A build prints progress
while pip runs (it takes ~5-8 minutes and ~10 GB per release), keeps pip's
output in ``build.log`` beside it, and is serialised with a lock file so two
harness processes never build the same environment at once. Before a build,
the cache's disk must have room for one (``$SCRIPTED_RUNTIME_ENV_MIN_FREE_GB``,
default 12): otherwise pip would fail minutes in, deep in its log, with a
half-installed environment taking the space; the error lists the cached
environments and their sizes instead.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, List, Optional

from scripted_runtime.user_side import settings
from scripted_runtime.user_side.builds import constraints

ENV_CACHE_VAR = "SCRIPTED_RUNTIME_ENV_CACHE"
LAST_USED = ".last-used"  # touched on every use of an environment
READY = "READY"
BUILD_TIMEOUT_S = 40 * 60
MIN_FREE_VAR = "SCRIPTED_RUNTIME_ENV_MIN_FREE_GB"
# The releases' environments measured 10-11 GB here (0.5.8.post1 .. 0.5.23).
DEFAULT_MIN_FREE_GB = 12.0
NO_SPACE = "No space left on device"
FULL_DISK_GB = 0.5  # what a failed install leaves at most on a disk it filled
# Our own runtime needs (sglang already depends on both; pinned here so a
# requirement that does not pull them still yields a usable side).
HARNESS_REQUIREMENTS = ("pyzmq>=25", "requests>=2.28", "hypothesis>=6.100")
# Import names of HARNESS_REQUIREMENTS, checked on every reuse: an environment
# built before a requirement was added gets it installed then.
HARNESS_IMPORTS = ("zmq", "requests", "hypothesis")


class EnvBuildError(RuntimeError):
    """An environment could not be built; the message names the log."""


class DiskSpaceError(EnvBuildError):
    """No room on the cache's disk: a problem of the machine, not of the build.
    ``summary`` is one short line for tables; the message says what to do."""

    def __init__(self, message: str, summary: str) -> None:
        super().__init__(message)
        self.summary = summary


def cache_root() -> Path:
    return Path(os.environ.get(ENV_CACHE_VAR) or Path.home() / ".cache" / "scripted-runtime" / "envs")


def slug(requirement: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", requirement.replace("==", "-")).strip("_")


def env_dir(requirement: str) -> Path:
    return cache_root() / slug(requirement)


def python_of(env: Path) -> Path:
    return env / "bin" / "python"


def ready_info(env: Path) -> Optional[dict]:
    marker = env / READY
    if not marker.is_file() or not python_of(env).exists():
        return None
    try:
        return json.loads(marker.read_text())
    except ValueError:
        return None


def dir_size_gb(path: Path) -> float:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total / 1e9


def _last_line(log: Path) -> str:
    """pip's latest action (``Collecting torch==...``), for progress lines."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.path.getsize(log) - 4096))
            lines = [l for l in f.read().decode(errors="replace").splitlines()
                     if l.strip() and not l.startswith("WARNING: Location")]
    except OSError:
        return ""
    return lines[-1].strip()[:120] if lines else ""


def _run_logged(cmd: List[str], log: Path, *, label: str, progress: Callable[[str], None],
                timeout_s: float, every_s: float = 30.0, watch: Optional[Path] = None) -> None:
    """Run ``cmd`` with its output appended to ``log``; report progress every
    ``every_s`` seconds; raise EnvBuildError on failure or timeout."""
    t0 = time.monotonic()
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        done = threading.Event()

        def report() -> None:
            while not done.wait(every_s):
                size = f", {dir_size_gb(watch):.1f} GB installed" if watch else ""
                progress(f"{label}: {time.monotonic() - t0:.0f}s{size}; {_last_line(log)}")

        threading.Thread(target=report, daemon=True).start()
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            raise EnvBuildError(f"{label}: still running after {timeout_s:.0f}s, killed; see {log}")
        finally:
            done.set()
    if code != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
        raise EnvBuildError(f"{label} failed (exit {code}); last lines of {log}:\n{tail}")


def _lock_within(lock, timeout_s: float, *, what: str, progress: Callable[[str], None]) -> None:
    """Take an exclusive lock on ``lock``, waiting at most ``timeout_s`` for its holder."""
    deadline = time.monotonic() + timeout_s
    said = False
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise EnvBuildError(f"waited {timeout_s:.0f}s for {what} ({lock.name} still locked); "
                                    "if no such process runs, delete the lock file") from None
            if not said:
                progress(f"waiting for {what} (at most {timeout_s:.0f}s)")
                said = True
            time.sleep(2.0)


def ensure_harness_requirements(env: Path, *, progress: Callable[[str], None],
                                timeout_s: float = 600.0) -> None:
    """Install whatever of HARNESS_REQUIREMENTS a ready environment lacks."""
    probe = ("import importlib.util, sys; "
             f"print(' '.join(m for m in {HARNESS_IMPORTS!r} if importlib.util.find_spec(m) is None))")
    check = subprocess.run([str(python_of(env)), "-c", probe], capture_output=True, text=True, timeout=120)
    missing = check.stdout.split()
    if check.returncode != 0 or not missing:
        return
    wanted = [r for r, m in zip(HARNESS_REQUIREMENTS, HARNESS_IMPORTS) if m in missing]
    progress(f"{env}: installing harness requirements it lacks: {' '.join(wanted)}")
    _run_logged([str(python_of(env)), "-m", "pip", "install", "--progress-bar", "off", *wanted],
                env / "build.log", label=f"pip install {' '.join(wanted)}", progress=progress,
                timeout_s=timeout_s)


def ensure_env(requirement: str, *, progress: Callable[[str], None] = None,
               python: str = sys.executable, timeout_s: float = BUILD_TIMEOUT_S) -> Path:
    """The python executable of a cached environment holding ``requirement``,
    built now if it does not exist yet."""
    progress = progress or (lambda line: print(f"[env] {line}", file=sys.stderr, flush=True))
    env = env_dir(requirement)
    info = ready_info(env)
    if info:
        progress(f"reusing {env} (sglang {info.get('sglang_version')})")
        ensure_harness_requirements(env, progress=progress)
        _stamp(env)
        return python_of(env)
    env.parent.mkdir(parents=True, exist_ok=True)
    with open(env.parent / f".{env.name}.lock", "w") as lock:
        _lock_within(lock, timeout_s, what=f"another process building {env}", progress=progress)
        info = ready_info(env)
        if info:  # built by the process we waited for
            progress(f"reusing {env} (sglang {info.get('sglang_version')})")
            _stamp(env)
            return python_of(env)
        python_path = _build(requirement, env, progress=progress, python=python, timeout_s=timeout_s)
        _stamp(env)
        return python_path


def _stamp(env: Path) -> None:
    """Record that ``env`` was just used (``envs list`` shows it; ``envs prune`` keeps the recent)."""
    try:
        (env / LAST_USED).touch()
    except OSError:
        pass  # a read-only cache is still usable; only pruning order suffers


def min_free_gb() -> float:
    """Free space a build needs on the cache's disk, in GB."""
    try:
        return settings.nonnegative_float(MIN_FREE_VAR, DEFAULT_MIN_FREE_GB, unit="GB")
    except ValueError as exc:
        raise EnvBuildError(str(exc)) from None


def cached_envs() -> List[Path]:
    """The environment directories under the cache root, by name."""
    root = cache_root()
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def describe_cached(env: Path) -> str:
    info = ready_info(env)
    if info is None:
        return f"{env} (unfinished build, {dir_size_gb(env):.1f} GB)"
    size = info.get("size_gb")
    size = f"{size} GB" if size is not None else f"{dir_size_gb(env):.1f} GB"
    return f"{env} (sglang {info.get('sglang_version')}, {size}, built {info.get('built_at', '?')})"


def check_free_space(requirement: str, env: Path, *, need_gb: Optional[float] = None) -> None:
    """Raise DiskSpaceError, naming what to remove, if ``env``'s disk has no room for a build."""
    need_gb = min_free_gb() if need_gb is None else need_gb
    free_gb = shutil.disk_usage(env.parent).free / 1e9
    if free_gb >= need_gb:
        return
    others = [describe_cached(p) for p in cached_envs() if p != env]
    listing = ("; cached environments: " + "; ".join(others)) if others else "; no other environment is cached"
    raise DiskSpaceError(
        f"building the environment for {requirement} needs about {need_gb:.0f} GB, but only "
        f"{free_gb:.1f} GB is free on the disk of {env.parent}{listing}. Remove environments you no "
        f"longer need (rm -rf DIR), point {ENV_CACHE_VAR} at a disk with room, or set {MIN_FREE_VAR} "
        "lower if this build needs less",
        f"no disk space for {requirement}: {free_gb:.1f} GB free, {need_gb:.0f} GB needed")


def _disk_full(env: Path, error: str) -> bool:
    """Whether a failed install ran out of disk. pip's own message may not
    be in the log: the log is on the full disk too (seen here: the line was
    cut at "Could not install packages due to an OSEr"), so a disk with
    less than FULL_DISK_GB left counts as full as well."""
    if NO_SPACE in error or "[Errno 28]" in error:
        return True
    try:
        return shutil.disk_usage(env).free < FULL_DISK_GB * 1e9
    except OSError:
        return False


def _free_failed_build(env: Path) -> None:
    """Delete a failed build's files except its log: the space it took is
    what the next build needs, the log is what the error names."""
    for child in env.iterdir():
        if child.name == "build.log":
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _build(requirement: str, env: Path, *, progress, python: str, timeout_s: float) -> Path:
    if env.exists():
        progress(f"removing unfinished environment {env}")
        shutil.rmtree(env)
    check_free_space(requirement, env)
    env.mkdir(parents=True)
    log = env / "build.log"
    pins = constraints.for_requirement(requirement)
    t0 = time.monotonic()
    progress(f"building {env} for {requirement} (once; ~5-8 min, ~10 GB)")
    for pin in pins:
        progress(f"  with {pin.requirement}: {pin.why}")
    _run_logged([python, "-m", "venv", str(env)], log, label="venv", progress=progress, timeout_s=300)
    cmd = [str(python_of(env)), "-m", "pip", "install", "--progress-bar", "off",
           requirement, *HARNESS_REQUIREMENTS, *(p.requirement for p in pins)]
    try:
        _run_logged(cmd, log, label=f"pip install {requirement}", progress=progress,
                    timeout_s=timeout_s, watch=env)
    except EnvBuildError as exc:
        if not _disk_full(env, str(exc)):
            raise
        _free_failed_build(env)
        raise DiskSpaceError(f"the disk of {env} filled up while pip installed {requirement}; the "
                             f"half-installed environment was deleted (its build.log kept). Free space, "
                             f"or point {ENV_CACHE_VAR} at a disk with room, and run again.\n{exc}",
                             f"the disk filled up while pip installed {requirement}") from None
    check = subprocess.run([str(python_of(env)), "-c", "import importlib.metadata as m; "
                            "print(m.version('sglang'))"], capture_output=True, text=True, timeout=120)
    if check.returncode != 0:
        raise EnvBuildError(f"{env}: sglang not importable after install: {check.stderr.strip()[-500:]}")
    version = check.stdout.strip()
    (env / READY).write_text(json.dumps({
        "requirement": requirement, "sglang_version": version,
        "constraints": [p.requirement for p in pins],
        "built_s": round(time.monotonic() - t0, 1), "size_gb": round(dir_size_gb(env), 1),
        "built_at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }, indent=1))
    progress(f"built {env} (sglang {version}) in {time.monotonic() - t0:.0f}s")
    return python_of(env)
