"""Process templates (docs/internals.md, "Process templates"): a server
forked from a template is the server a fresh spawn gives, nothing of a
template outlives the harness that started it, and a child harness (a
``scripted-runtime`` command run from this one) forks its server from this
process's template instead of importing SGLang again."""
from __future__ import annotations

import json
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




def _kill_a_harness_and_wait(env, *, own_template):
    """Start HARNESS with ``env``, SIGKILL it once its server is up; the
    template's pid, whether it was shared, and which of the processes it
    listed still run 20 s later (or once every one that should end has:
    the server's, and the template's if ``own_template``)."""
    HARNESS = textwrap.dedent("""
        import os, sys, time
        from scripted_runtime import ScriptedServer
        from scripted_runtime.user_side import templates
        server = ScriptedServer.start(topology="pp1-normal")
        (template,) = templates.running()
        print(template.socket_path, template.log_path, flush=True)
        print(template.pid, int(template.shared), *server.pids(), flush=True)
        time.sleep(600)
    """)
    harness = subprocess.Popen([sys.executable, "-c", HARNESS], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                               env=env)
    try:
        files = harness.stdout.readline().split()
        line = harness.stdout.readline()
        template_pid, shared, *server_pids = [int(p) for p in line.split()]
        assert len(server_pids) >= 2, f"expected the template and the server's processes, got {line!r}"
        assert all(processes.is_running(p) for p in [template_pid, *server_pids])
        harness.send_signal(signal.SIGKILL)
        harness.wait(timeout=10)
        ending = server_pids + ([template_pid] if own_template else [])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(processes.is_running(p) for p in ending):
            time.sleep(0.2)
        left = [p for p in [template_pid, *server_pids] if processes.is_running(p)]
        if own_template and not left:  # its socket, the socket's directory and its log went with it
            litter = [f for f in (*files, os.path.dirname(files[0])) if os.path.exists(f)]
            assert not litter, f"a killed harness's template left {litter}"
        return template_pid, bool(shared), left
    finally:
        if harness.poll() is None:
            harness.kill()


def test_a_killed_harness_leaves_no_template_and_no_server(tmp_path):
    """SIGKILL: no atexit runs, so the template must notice its pipe closing
    by itself, and the server its harness gone. (No parent's template to
    share: the harness starts its own.)"""
    env = {k: v for k, v in os.environ.items() if k != templates.ENV_SHARE}
    template_pid, shared, left = _kill_a_harness_and_wait({**env, templates.ENV_TEMPLATES: "on"}, own_template=True)
    assert not shared
    assert not left, f"still running 20 s after the harness was killed: {left}"


def test_a_child_harness_forks_from_this_process_template_and_leaves_it_running(server_pool, tmp_path):
    """A ``scripted-runtime run`` started from this process (as an ``ab``
    side, an ``explore -n`` worker or a user's script would be) uses the
    template of the suite's servers; a child harness killed takes its server
    with it and leaves the shared template serving. Under pytest-xdist that
    template is the controller's, shared by every worker (the plugin's
    rendezvous); in one process, this process's own."""
    parent = server_pool.get("pp1-overlap")
    assert parent.forked and parent.template_shared == (templates._rendezvous_dir is not None), parent.origin
    result = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "-m", "scripted_runtime.user_side.cli", "run",
                           "scenarios/demo.py:chunked_then_decode", "--result-json", str(result)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    payload = json.loads(result.read_text())
    assert payload["template"] == {"pid": parent.template_pid, "shared": True}, payload
    assert f"forked from process template {parent.template_pid} of a parent harness" in proc.stderr
    template_pid, shared, left = _kill_a_harness_and_wait({**os.environ, templates.ENV_TEMPLATES: "on"},
                                                         own_template=False)
    assert shared and template_pid == parent.template_pid
    assert left == [template_pid], f"the killed child's server is still running: {left}"
    assert parent.run("scenarios/demo.py:chunked_then_decode").passed  # the pool's server is untouched
