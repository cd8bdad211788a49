"""The step trace's writer (a shared memory map ahead of its text): what a
closed trace, a trace whose process was killed, and a long one hold."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from scripted_runtime import timeline
from scripted_runtime.scheduler_side import trace_record
from scripted_runtime.scheduler_side.check_registry import Violation
from scripted_runtime.scheduler_side.invariants import InvariantChecker


def test_closed_trace_is_exactly_its_lines(tmp_path):
    path = tmp_path / "t.jsonl"
    w = trace_record.TraceWriter(str(path))
    w.write_header({"trace_format": 1, "script": "s"})
    for i in range(3):
        w.append({"step": i, "it": i})
    w.close()
    w.close()  # idempotent
    text = path.read_bytes()
    assert b"\0" not in text
    assert text.count(b"\n") == 4
    header, records = timeline.load(str(path))
    assert header["script"] == "s" and [r["step"] for r in records] == [0, 1, 2]


def test_trace_grows_past_one_mapped_block(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_record.TraceWriter, "FIRST_BLOCK", 4096)
    monkeypatch.setattr(trace_record.TraceWriter, "MAX_BLOCK", 8192)
    path = tmp_path / "t.jsonl"
    w = trace_record.TraceWriter(str(path))
    w.write_header({"trace_format": 1})
    for i in range(500):  # ~30 KiB: several blocks, lines across their ends
        w.append({"step": i, "pad": "x" * 40})
    w.append({"step": 500, "pad": "y" * 20000})  # a line longer than a block
    w.close()
    _, records = timeline.load(str(path))
    assert [r["step"] for r in records] == list(range(501))
    assert records[-1]["pad"] == "y" * 20000
    assert path.stat().st_size == len(path.read_bytes().rstrip(b"\0"))


def test_killed_writer_leaves_every_appended_line_and_seal_cuts_the_rest(tmp_path):
    """SIGKILL right after an append: the line is in the file (the map is
    shared), NUL bytes follow it; load ignores them, seal cuts them."""
    path = tmp_path / "t.jsonl"
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from scripted_runtime.scheduler_side import trace_record
        w = trace_record.TraceWriter({str(path)!r})
        w.write_header({{"trace_format": 1}})
        for i in range(7):
            w.append({{"step": i}})
        print("ready", flush=True)
        time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True, cwd=os.getcwd(),
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        assert child.stdout.readline().strip() == "ready"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    raw = path.read_bytes()
    assert raw.endswith(b"\0")
    _, records = timeline.load(str(path))
    assert [r["step"] for r in records] == list(range(7))
    timeline.seal(str(path))
    sealed = path.read_bytes()
    assert sealed == raw.rstrip(b"\0") and sealed.endswith(b"\n")
    timeline.seal(str(path))  # a sealed file is left as it is
    assert path.read_bytes() == sealed


def test_checker_builds_its_list_of_checks_again_when_one_registers(monkeypatch):
    from scripted_runtime.scheduler_side import check_registry

    monkeypatch.setattr(check_registry, "_extension_checks", {})
    checker = InvariantChecker()
    before = list(checker._runs())
    assert checker._runs() is checker._runs()  # cached between iterations

    def late(view, memory):
        return Violation("late_check", "seen")

    check_registry.register(check_registry.Check("late_check", "extension", "doc", late))
    assert list(checker._runs()) == before + [late]


def test_a_file_system_without_fallocate_still_gets_its_blocks(tmp_path, monkeypatch):
    import errno

    def refuse(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "not supported")

    monkeypatch.setattr(os, "posix_fallocate", refuse)
    path = tmp_path / "t.jsonl"
    w = trace_record.TraceWriter(str(path))
    w.write_header({"trace_format": 1})
    w.append({"step": 0})
    w.close()
    assert [r["step"] for r in timeline.load(str(path))[1]] == [0] and b"\0" not in path.read_bytes()


def test_a_full_disk_is_an_error_at_the_block_not_a_signal_later(tmp_path, monkeypatch):
    import errno

    import pytest

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    w = trace_record.TraceWriter(str(tmp_path / "t.jsonl"))
    with pytest.raises(OSError, match="No space"):
        w.write_header({"trace_format": 1})
    w.close()
