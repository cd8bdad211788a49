"""The pytest plugin, as a project outside this repo uses it: a fresh
directory with no conftest.py from here, only the installed package (its
``pytest11`` entry point) and a test file with the marker and fixture.
Run with ``pytester`` in a subprocess, as a user's pytest would."""
from __future__ import annotations

import textwrap

import pytest

pytest_plugins = ["pytester"]

SCENARIOS = '''
def finishes(ctx):
    req = ctx.start_req(prompt_len=100, max_new_tokens=3, ignore_eos=True)
    yield from ctx.wait_finished(req, max_steps=100)
    return ctx.loop_kind


def expects_five_tokens(ctx):
    req = ctx.start_req(prompt_len=8, max_new_tokens=3, ignore_eos=True)
    yield from ctx.wait_finished(req, max_steps=100)
    assert len(req.output_ids) == 5, f"got {len(req.output_ids)} tokens"
'''

TESTS = '''
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.scripted_runtime(pp={pp}, overlap=False)
def test_finishes(scripted_server):
    result = scripted_server.run(f"{{HERE / 'my_scenarios.py'}}:finishes")
    assert result.passed, result.summary()
    assert scripted_server.topology == "{topology}"


@pytest.mark.scripted_runtime(pp={pp}, overlap=False)
def test_wrong_length(scripted_server):
    result = scripted_server.run(f"{{HERE / 'my_scenarios.py'}}:expects_five_tokens")
    assert result.passed, result.error
'''


def _foreign_project(pytester, pp, topology):
    pytester.makepyfile(my_scenarios=textwrap.dedent(SCENARIOS))
    pytester.makepyfile(test_foreign=textwrap.dedent(TESTS.format(pp=pp, topology=topology)))
    assert not (pytester.path / "conftest.py").exists()
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "--basetemp",
                                         str(pytester.path / "tmp"), timeout=900)


def _check_run(result):
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    # the failing test's report: the plugin's section with the run, its error and its trace
    assert "scripted-runtime" in out and "FAIL " in out and "expects_five_tokens" in out
    assert "got 3 tokens" in out
    assert "trace: " in out and "expects_five_tokens.jsonl" in out and "trace render" in out
    # the passing test asserted its server's topology (the marker's) inside the foreign run


def test_a_foreign_project_uses_the_marker_and_fixture_at_pp1(pytester):
    result = _foreign_project(pytester, 1, "pp1-normal")
    _check_run(result)
    # traces: only the failing run's is kept (the default, --scripted-runtime-traces failed)
    traces = sorted(p.name for p in (pytester.path / "tmp" / "scripted-runtime-traces").rglob("*.jsonl"))
    assert len(traces) == 1 and "expects_five_tokens" in traces[0], traces


@pytest.mark.pp4
@pytest.mark.slow
def test_a_foreign_project_uses_the_marker_and_fixture_at_pp4(pytester):
    _check_run(_foreign_project(pytester, 4, "pp4"))
