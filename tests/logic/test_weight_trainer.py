"""The trainer rank of distributed weight updates (scheduler_side/weight_trainer*.py):
what decides that it broadcasts, and that it never outlives the scheduler that started it.
The broadcast itself against a real scheduler: tests/server/test_rl_weight_sync.py."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from scripted_runtime.hooks import sglang_compat

ROOT = Path(__file__).resolve().parents[2]


def _scheduler(session: bool, groups: tuple) -> SimpleNamespace:
    runner = SimpleNamespace(weight_updater=SimpleNamespace(_model_update_group={g: object() for g in groups}))
    return SimpleNamespace(weight_updater=SimpleNamespace(_session=object() if session else None),
                           tp_worker=SimpleNamespace(model_runner=runner))


def test_the_handler_receives_only_in_a_session_over_a_joined_group():
    update = SimpleNamespace(group_name="g")
    assert sglang_compat.distributed_update_receives(_scheduler(True, ("g",)), update)
    assert not sglang_compat.distributed_update_receives(_scheduler(False, ("g",)), update)  # refused first
    assert not sglang_compat.distributed_update_receives(_scheduler(True, ("other",)), update)  # receive asserts
    assert sglang_compat.weight_update_groups(_scheduler(False, ("b", "a"))) == ("a", "b")
    assert sglang_compat.weight_update_groups(SimpleNamespace()) == ()


PARENT = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-m", "scripted_runtime.scheduler_side.weight_trainer_main",
                          str(os.getpid())], stdin=int(sys.argv[1]))
print(child.pid, flush=True)
time.sleep(1.0)  # the child has set its parent-death signal by now (its first statement)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_trainer_rank_dies_with_the_scheduler_that_started_it():
    """Its stdin stays open (this test holds the pipe's other end, as a
    scheduler wedged in SGLang would): only the parent's death can end it,
    as when a scheduler crashes or is killed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    read_end, write_end = os.pipe()
    try:
        parent = subprocess.run([sys.executable, "-c", textwrap.dedent(PARENT), str(read_end)], capture_output=True,
                                text=True, timeout=60, env=env, cwd=str(ROOT), pass_fds=(read_end,))
        assert parent.returncode == 0, parent.stderr
        pid = int(parent.stdout.split()[0])
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        alive = _alive(pid)
        if alive:
            os.kill(pid, 9)
        assert not alive, f"the trainer rank {pid} outlived its parent"
    finally:
        os.close(read_end)
        os.close(write_end)


SCHEDULER_SIDE = """
import sys, torch
from sglang.srt.utils.common import init_custom_process_group
pg = init_custom_process_group(backend="gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], world_size=2, rank=1,
                               group_name="harness_trainer")
t = torch.zeros(3)
torch.distributed.broadcast(t, src=0, group=pg)
print(t.tolist(), flush=True)
"""
TRAINER_SIDE = """
import sys, torch
from scripted_runtime.hooks import sglang_compat
pg = sglang_compat.join_custom_process_group(backend="gloo", init_method="tcp://127.0.0.1:" + sys.argv[1],
                                             world_size=2, rank=0, group_name="harness_trainer")
torch.distributed.broadcast(torch.tensor([1.0, 2.0, 3.0]), src=0, group=pg)
"""


def test_sglang_s_group_constructor_is_still_the_one_the_trainer_mirrors():
    """The facts ``join_custom_process_group`` mirrors, read off the
    installed SGLang's ``init_custom_process_group`` (the run of both sides
    is in the slow lane, below)."""
    import importlib
    import inspect

    pytest.importorskip("sglang")
    module, name = sglang_compat.CUSTOM_PROCESS_GROUP_FUNCTION
    source = inspect.getsource(getattr(importlib.import_module(module), name))
    for fact in ("rendezvous(init_method, rank, world_size, timeout=timeout)", "PrefixStore(group_name, store)",
                 "_new_process_group_helper(", "_world.pg_group_ranks[pg] = {i: i for i in range(world_size)}"):
        assert fact in source, f"SGLang's {name} changed: {fact!r} is gone; update sglang_compat's mirror"


@pytest.mark.slow
def test_the_trainer_side_joins_the_group_sglang_s_own_function_builds():
    """The trainer rank mirrors SGLang's ``init_custom_process_group`` with
    torch alone (to start without importing SGLang): the two must form one
    group, or the scheduler's join waits for 30 minutes. Run against the
    installed SGLang's function, so a release that changes it fails here."""
    pytest.importorskip("sglang")
    from scripted_runtime.scheduler_side.weight_trainer import free_port

    port = str(free_port())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), port], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))
             for code in (TRAINER_SIDE, SCHEDULER_SIDE)]
    try:
        outs = [p.communicate(timeout=90) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    assert outs[1][0].strip() == "[1.0, 2.0, 3.0]", outs[1]
