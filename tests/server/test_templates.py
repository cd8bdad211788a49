"""Process templates (docs/internals.md, "Process templates"): a server
forked from a template is the server a fresh spawn gives, and nothing of a
template outlives the harness that started it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from scripted_runtime import ScriptedServer, timeline
from scripted_runtime.user_side import processes, templates
from scripted_runtime.user_side.explore import determinism

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]


def fingerprint_then_work(ctx):
    """The engine as it came up (the reset fingerprint), then a chunked
    prompt beside a short one, a flush after both finished and a prefix hit."""
    from scripted_runtime.scheduler_side import reset_fingerprint

    fresh = reset_fingerprint.take(ctx.scheduler)
    prompt = [3 + (7 * i) % 500 for i in range(150)]
    long = ctx.start_req(input_ids=prompt, max_new_tokens=6, ignore_eos=True, temperature=0.0)
    short = ctx.start_req(input_ids=list(range(200, 220)), max_new_tokens=4, ignore_eos=True, temperature=0.0)
    yield from ctx.wait_finished(long, short, max_steps=300)
    again = ctx.start_req(input_ids=prompt, max_new_tokens=3, ignore_eos=True, temperature=0.0)
    yield from ctx.wait_finished(again, max_steps=300)
    for _ in range(3):
        yield
    op = ctx.flush_cache()
    yield
    return {"fingerprint": repr(sorted(fresh.items())), "outputs": [long.output_ids, short.output_ids,
                                                                  again.output_ids],
            "flush": op.success, "engine": ctx.engine_stats()}


def test_a_server_forked_from_a_template_is_the_server_a_spawn_gives(tmp_path, monkeypatch):
    seen = {}
    for mode in ("off", "on"):
        monkeypatch.setenv(templates.ENV_TEMPLATES, mode)
        with ScriptedServer.start(topology="pp1-overlap", log_dir=tmp_path / mode) as server:
            assert server.forked == (mode == "on"), server.forked
            result = server.run(f"{HERE}:fingerprint_then_work", trace=tmp_path / f"{mode}.jsonl")
            assert result.passed, result.summary()
            seen[mode] = (result.value, timeline.load(str(tmp_path / f"{mode}.jsonl"))[1])
    (spawned, spawned_trace), (forked, forked_trace) = seen["off"], seen["on"]
    assert forked == spawned  # the fresh engine's fingerprint, the greedy outputs, the flush, the pools
    assert len(forked_trace) > 10
    difference = determinism.compare(spawned_trace, forked_trace)
    assert difference is None, difference.describe()


def test_a_killed_harness_leaves_no_template_and_no_server(tmp_path):
    """SIGKILL: no atexit runs, so the template must notice its pipe closing
    by itself, and the server its harness gone."""
    HARNESS = textwrap.dedent("""
        import os, sys, time
        from scripted_runtime import ScriptedServer
        from scripted_runtime.user_side import templates
        server = ScriptedServer.start(topology="pp1-normal")
        (template,) = templates.running()
        print(template.pid, *server.pids(), flush=True)
        time.sleep(600)
    """)
    harness = subprocess.Popen([sys.executable, "-c", HARNESS], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, templates.ENV_TEMPLATES: "on"})
    try:
        line = harness.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) >= 3, f"expected the template and the server's processes, got {line!r}"
        assert all(processes.is_running(p) for p in pids)
        harness.send_signal(signal.SIGKILL)
        harness.wait(timeout=10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(processes.is_running(p) for p in pids):
            time.sleep(0.2)
        left = [p for p in pids if processes.is_running(p)]
        assert not left, f"still running 20 s after the harness was killed: {left}"
    finally:
        if harness.poll() is None:
            harness.kill()
