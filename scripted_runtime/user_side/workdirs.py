"""Each server start makes a work directory (``scripted-runtime-*`` in the
system temp dir: the server log, the step traces, crash reports), kept after
shutdown so a failure can be read afterwards. Without pruning they pile up
(374 of them, 168 MB, after a few days of running the suite here). A start
removes the ones nothing has written to for ``keep_days`` days.
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import List, Optional

from scripted_runtime.user_side import settings

PREFIX = "scripted-runtime-"
ENV_KEEP_DAYS = "SCRIPTED_RUNTIME_KEEP_DAYS"
DEFAULT_KEEP_DAYS = 7.0


def keep_days() -> float:
    """``$SCRIPTED_RUNTIME_KEEP_DAYS`` (0 keeps every directory), else 7."""
    return settings.nonnegative_float(ENV_KEEP_DAYS, DEFAULT_KEEP_DAYS, unit="days", zero_means="0 keeps everything")


def last_written(path: Path) -> float:
    """The newest mtime of the directory, its entries and theirs (a log or
    trace still being written keeps its directory fresh)."""
    newest = path.stat().st_mtime
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                newest = max(newest, os.stat(os.path.join(root, name), follow_symlinks=False).st_mtime)
            except OSError:
                pass  # removed meanwhile
    return newest


def prune_stale(parent: Optional[Path] = None, *, days: Optional[float] = None) -> List[Path]:
    """Remove this user's ``scripted-runtime-*`` directories under ``parent``
    (the system temp dir by default) not written for ``days`` days; returns
    the ones removed. Never raises for a directory it cannot read or remove."""
    days = keep_days() if days is None else days
    if days <= 0:
        return []
    parent = Path(parent or tempfile.gettempdir())
    cutoff = time.time() - days * 86400
    uid = os.getuid()
    removed = []
    try:
        candidates = [p for p in parent.iterdir() if p.name.startswith(PREFIX)]
    except OSError:
        return []
    for path in candidates:
        try:
            st = path.lstat()  # a symlink is S_ISLNK here, so it is skipped, not followed
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
                continue
            if st.st_mtime >= cutoff or last_written(path) >= cutoff:  # the walk only for old ones
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(path)
    return removed
