"""Git revisions of an SGLang checkout as throwaway worktrees.

``ensure_worktree(repo, rev)`` resolves ``rev`` to a commit and checks it out
(detached) under ``<cache>/worktrees/<repo>-<sha12>``, reusing the worktree
when it exists. The user's checkout is never touched; ``remove_worktree``
drops one again (``git worktree remove``).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

from scripted_runtime.user_side.builds import envs

GIT_TIMEOUT_S = 300


class WorktreeError(RuntimeError):
    pass


def _git(repo: Path, *args: str, timeout: float = GIT_TIMEOUT_S) -> str:
    try:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        raise WorktreeError(f"git {' '.join(args)} in {repo} did not finish within {timeout:.0f}s") from None
    if out.returncode != 0:
        raise WorktreeError(f"git {' '.join(args)} in {repo} failed: {out.stderr.strip()[-400:]}")
    return out.stdout.strip()


def resolve(repo: Path, rev: str) -> str:
    return _git(repo, "rev-parse", "--verify", f"{rev}^{{commit}}")


def worktree_root() -> Path:
    return envs.cache_root().parent / "worktrees"


def ensure_worktree(repo: Path, rev: str, *, progress: Optional[Callable[[str], None]] = None) -> Path:
    progress = progress or (lambda line: print(f"[worktree] {line}", file=sys.stderr, flush=True))
    sha = resolve(repo, rev)
    path = worktree_root() / f"{repo.name}-{sha[:12]}"
    if (path / ".git").exists():
        progress(f"reusing {path} ({rev} = {sha[:12]})")
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    progress(f"checking out {rev} ({sha[:12]}) of {repo} into {path}")
    _git(repo, "worktree", "add", "--detach", str(path), sha)
    return path


def remove_worktree(repo: Path, path: Path) -> None:
    _git(repo, "worktree", "remove", "--force", str(path))
