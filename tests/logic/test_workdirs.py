"""Pruning of old server work directories (no SGLang)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from scripted_runtime.user_side import workdirs

DAY = 86400


def make(parent: Path, name: str, age_days: float, *, fresh_file: bool = False) -> Path:
    d = parent / name
    (d / "traces").mkdir(parents=True)
    (d / "server.log").write_text("log")
    (d / "traces" / "0001-x.jsonl").write_text("{}\n")
    old = time.time() - age_days * DAY
    for p in (d / "traces" / "0001-x.jsonl", d / "server.log", d / "traces", d):
        os.utime(p, (old, old))
    if fresh_file:
        (d / "traces" / "0002-y.jsonl").write_text("{}\n")  # written now
        os.utime(d / "traces", (old, old))  # only the file itself is new
    return d


def test_removes_only_stale_work_dirs(tmp_path):
    stale = make(tmp_path, "scripted-runtime-old", 10)
    recent = make(tmp_path, "scripted-runtime-new", 1)
    still_written = make(tmp_path, "scripted-runtime-live", 10, fresh_file=True)
    other = make(tmp_path, "not-ours-old", 10)
    link = tmp_path / "scripted-runtime-link"
    link.symlink_to(other)

    removed = workdirs.prune_stale(tmp_path, days=7)

    assert removed == [stale]
    assert not stale.exists()
    for kept in (recent, still_written, other, link):
        assert kept.exists(), kept
    assert (other / "server.log").exists(), "a symlink's target must not be followed"


def test_zero_days_keeps_everything(tmp_path, monkeypatch):
    stale = make(tmp_path, "scripted-runtime-old", 400)
    monkeypatch.setenv(workdirs.ENV_KEEP_DAYS, "0")
    assert workdirs.prune_stale(tmp_path) == []
    assert stale.exists()


def test_keep_days_from_the_environment(tmp_path, monkeypatch):
    stale = make(tmp_path, "scripted-runtime-old", 3)
    monkeypatch.setenv(workdirs.ENV_KEEP_DAYS, "2.5")
    assert workdirs.prune_stale(tmp_path) == [stale]
    monkeypatch.delenv(workdirs.ENV_KEEP_DAYS)
    assert workdirs.keep_days() == workdirs.DEFAULT_KEEP_DAYS


@pytest.mark.parametrize("raw", ["soon", "-1", "nan"])
def test_bad_keep_days_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv(workdirs.ENV_KEEP_DAYS, raw)
    with pytest.raises(ValueError, match=workdirs.ENV_KEEP_DAYS):
        workdirs.keep_days()


def test_missing_parent_is_not_an_error(tmp_path):
    assert workdirs.prune_stale(tmp_path / "absent", days=7) == []
