"""Run scenarios in one SGLang build and report each scenario's outcome.

A side is a build SPEC (``spec.py``) made concrete: a Python interpreter plus
the paths to put first on PYTHONPATH (the harness itself, and a source tree
when the SPEC names one). The scenarios run in a child process,
``python -m scripted_runtime.user_side.cli run ... --result-json F``, all on one server
(restarted if a scenario crashes it), so a side never mixes its SGLang with
ours. A build that cannot be prepared (environment build, checkout) or whose
server does not start is reported as ``NO-START``, never as a scenario
failure; one that cannot be built for lack of disk space, as ``ERROR``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional

from scripted_runtime import module_paths
from scripted_runtime.errors import UsageError
from scripted_runtime.user_side.builds import envs, worktrees
from scripted_runtime.user_side.builds import spec as build_spec
from scripted_runtime.user_side.builds.spec import BuildSpec, find_package_dir
from scripted_runtime.user_side.server_config import ServerConfig

STATUSES = ("PASS", "FAIL", "CRASH", "NO-START", "ERROR")


def base_python(text: Optional[str]) -> str:
    """The interpreter source-tree and git sides run over (``--base-env SPEC``):
    this one for ``current`` or nothing, else the cached environment of a pip
    requirement (built on first use). A SPEC of another kind, or a build that
    fails, is a ``UsageError`` naming it."""
    if not text or text == "current":
        return sys.executable
    base = build_spec.parse(text)
    if base.kind != "pip" or base.revert:
        raise UsageError(f"--base-env must be 'current' or a pip requirement such as sglang==0.5.12.post1, "
                         f"got {text!r}")
    try:
        return str(envs.ensure_env(base.requirement))
    except envs.EnvBuildError as exc:
        raise UsageError(f"--base-env {text}: {exc}") from None


@dataclass
class Outcome:
    side: str
    scenario: str
    status: str  # one of STATUSES
    signature: str = ""
    steps: int = 0
    seconds: float = 0.0


@dataclass
class SideReport:
    side: str
    sglang_version: Optional[str] = None
    start_s: Optional[float] = None
    wall_s: float = 0.0
    outcomes: List[Outcome] = field(default_factory=list)
    log: Optional[str] = None  # the child's output
    # the process template its server forked from: {"pid", "shared"} (shared: this process's,
    # or its parent's), None when spawned
    template: Optional[dict] = None

    @property
    def started(self) -> bool:
        return all(o.status != "NO-START" for o in self.outcomes)

    @property
    def ran(self) -> bool:
        """Started, and every scenario came back with a result."""
        return all(o.status not in ("NO-START", "ERROR") for o in self.outcomes)


@dataclass
class PreparedBuild:
    python: str
    pythonpath: List[str]


def prepare(spec: BuildSpec, *, base_python: str = sys.executable,
            progress: Optional[Callable[[str], None]] = None) -> PreparedBuild:
    """Interpreter and PYTHONPATH for ``spec`` (builds/checks out on first use)."""
    if spec.kind == "current":
        return PreparedBuild(sys.executable, [])
    if spec.kind == "pip":
        return PreparedBuild(str(envs.ensure_env(spec.requirement, progress=progress)), [])
    if spec.kind == "source":
        return PreparedBuild(base_python, [str(spec.source)])
    if spec.kind == "git":
        tree = worktrees.ensure_worktree(spec.repo, spec.rev, progress=progress)
        pkg = find_package_dir(tree)
        if pkg is None:
            raise worktrees.WorktreeError(f"{spec.rev}: no sglang/__init__.py in {tree} or {tree}/python")
        return PreparedBuild(base_python, [str(pkg)])
    raise ValueError(f"unknown build kind {spec.kind!r}")


def child_environment(build: PreparedBuild) -> dict:
    """os.environ for a harness child running on ``build``: the harness and
    the build's source paths first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [module_paths.harness_path_entry(), *build.pythonpath] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if build.python != sys.executable:  # another environment: ours must not be named (this one's is ours)
        env.pop("VIRTUAL_ENV", None)
    return env


def run_side(spec: BuildSpec, scenarios: List[str], *, config: ServerConfig = ServerConfig(),
             timeout_s: float = 120.0, start_timeout_s: float = 300.0, base_python: str = sys.executable,
             progress: Optional[Callable[[str], None]] = None) -> SideReport:
    """Run ``scenarios`` on ``config``'s server in ``spec``'s build (the
    SPEC's reverted fixes added to it)."""
    progress = progress or (lambda line: print(f"[ab] {line}", file=sys.stderr, flush=True))
    report = SideReport(side=spec.label)
    t0 = time.monotonic()
    try:
        build = prepare(spec, base_python=base_python, progress=progress)
    except (envs.EnvBuildError, worktrees.WorktreeError, OSError) as exc:
        # A full disk says nothing about the build: ERROR (bisect-check aborts), not NO-START (skip).
        if isinstance(exc, envs.DiskSpaceError):
            status, why = "ERROR", exc.summary
        else:
            status, why = "NO-START", str(exc).splitlines()[0]
        report.outcomes = [Outcome(spec.label, s, status, f"build: {why}") for s in scenarios]
        report.log = str(exc)
        return report
    with tempfile.TemporaryDirectory(prefix="scripted-runtime-side-") as tmp:
        result_file = os.path.join(tmp, "result.json")
        config = config.replace(revert_fixes=(*config.revert_fixes, *spec.revert))
        cmd = [build.python, "-m", "scripted_runtime.user_side.cli", "run", *scenarios, *config.as_argv(),
               "--timeout", str(timeout_s), "--start-timeout", str(start_timeout_s), "--result-json", result_file]
        env = child_environment(build)
        deadline = start_timeout_s * 2 + len(scenarios) * (timeout_s + 30) + 60
        progress(f"{spec.label}: running {len(scenarios)} scenario(s) (pp={config.pp_size()}) with {build.python}")
        log_path = os.path.join(tmp, "side.log")
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=module_paths.harness_path_entry(),
                                    start_new_session=True)
            try:
                proc.wait(timeout=deadline)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        with open(log_path) as f:
            report.log = f.read()
        report.wall_s = time.monotonic() - t0
        payload = None
        if os.path.exists(result_file):
            with open(result_file) as f:
                payload = json.load(f)
    if payload is None:
        why = (f"side did not finish within {deadline:.0f}s" if proc.returncode in (-9, None)
               else f"side exited {proc.returncode} without a result: {_last_line(report.log)}")
        report.outcomes = [Outcome(spec.label, s, "ERROR", why) for s in scenarios]
        return report
    report.sglang_version = payload.get("sglang_version")
    report.start_s = payload.get("start_s")
    if (payload.get("template") or {}).get("pid"):
        report.template = payload["template"]
    if payload["status"] in ("NO-START", "USAGE"):
        status = "NO-START" if payload["status"] == "NO-START" else "ERROR"
        sig = _last_line(payload.get("error", "")) or "server did not start"
        report.outcomes = [Outcome(spec.label, s, status, sig) for s in scenarios]
        return report
    for s, o in zip(scenarios, payload["outcomes"]):
        report.outcomes.append(Outcome(spec.label, s, o["status"], o["signature"], o["steps"], o["seconds"]))
    for s in scenarios[len(payload["outcomes"]):]:
        report.outcomes.append(Outcome(spec.label, s, "ERROR", "not run (the side stopped early)"))
    return report


def _last_line(text: str) -> str:
    lines = [l.strip() for l in (text or "").splitlines() if l.strip()]
    return lines[-1][:200] if lines else ""
