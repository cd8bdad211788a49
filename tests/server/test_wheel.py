"""The installed wheel on real servers, from a directory outside the
checkout (slow lane: three server starts): the demo scenario, a short
exploration and a foreign project's pytest file with the plugin's
``scripted_server`` fixture. The wheel and its fresh environment:
tests/wheel_env.py; what the wheel holds: tests/logic/test_wheel.py."""
from __future__ import annotations

import re
import shutil

import pytest

from tests.wheel_env import ROOT, RUN_TIMEOUT_S, env_for, outside, run

FOREIGN_TEST = '''
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def finishes(ctx):
    req = ctx.start_req(prompt_len=40, max_new_tokens=3, ignore_eos=True)
    yield from ctx.wait_finished(req, max_steps=100)
    return len(req.output_ids)


@pytest.mark.scripted_runtime(pp=1, overlap=True)
def test_finishes(scripted_server):
    result = scripted_server.run(f"{HERE / 'test_foreign.py'}:finishes")
    assert result.passed, result.summary()
    assert result.value == 3
'''


@pytest.mark.slow
def test_the_installed_wheel_runs_the_demo_an_exploration_and_a_foreign_pytest_file(fresh_env, tmp_path):
    work = outside(tmp_path)
    env = env_for(fresh_env)
    cli = fresh_env / "bin" / "scripted-runtime"
    shutil.copy(ROOT / "scenarios" / "demo.py", work / "demo.py")

    demo = run([cli, "run", "demo.py:chunked_then_decode"], cwd=work, env=env, timeout=RUN_TIMEOUT_S)
    assert "PASS" in demo.stdout, demo.stdout

    found = work / "found"
    explored = run([cli, "explore", "--profile", "ci", "--max-examples", "5", "--database", "none",
                     "--out", found], cwd=work, env=env, timeout=RUN_TIMEOUT_S)
    assert re.search(r"explored pp1-overlap \(sglang [^)]+\): \d+ programs", explored.stdout), explored.stdout

    project = work / "project"
    project.mkdir()
    (project / "test_foreign.py").write_text(FOREIGN_TEST)
    ran = run([fresh_env / "bin" / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_foreign.py"],
               cwd=project, env=env, timeout=RUN_TIMEOUT_S)
    assert "1 passed" in ran.stdout, ran.stdout

    written = sorted(p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file())
    stray = [p for p in written if not p.startswith(("found/", "project/")) and p != "demo.py"]
    assert not stray, f"files written outside --out and the project: {stray}"
