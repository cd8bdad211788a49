"""Command-line usage errors: a bad scenario spec or option, or an unknown
fix toggle, exits 2 with one line, before any server starts."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from scripted_runtime.user_side import cli


def test_cli_usage_errors_exit_2(tmp_path):
    scenario = tmp_path / "s.py"
    scenario.write_text("def real(ctx):\n    yield\n")
    assert cli.check_script_spec(f"{scenario}:real").endswith("s.py:real")
    for spec, message in [
        (f"{tmp_path}/missing.py:real", "scenario file not found"),
        (f"{scenario}:nope", "has no function 'nope' (functions: real)"),
        ("no.such.module:fn", "scenario module not found"),
        ("justaname", "PATH.py:FUNCTION"),
    ]:
        with pytest.raises(cli.UsageError, match=re.escape(message)):
            cli.check_script_spec(spec)
    proc = subprocess.run([sys.executable, "-m", "scripted_runtime.user_side.cli", "run", f"{scenario}:nope"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0, "a usage error is one line"
    proc = subprocess.run([sys.executable, "-m", "scripted_runtime.user_side.cli", "run", f"{scenario}:real", "--pp", "3"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--pp must be 1 or 4" in proc.stderr


def test_fix_toggle_names_are_validated(capsys):
    from scripted_runtime.hooks import fix_toggles

    with pytest.raises(ValueError, match=r"unknown fix toggle\(s\) \['pr1'\]; known: pr27446"):
        fix_toggles.validate(["pr1"])
    assert cli.main(["run", "scenarios/demo.py:chunked_then_decode", "--revert-fix", "pr1"]) == 2
    assert "unknown fix toggle(s) ['pr1']" in capsys.readouterr().err


def test_topology_names_every_topology_and_may_not_contradict_the_flags():
    import argparse

    def config(**flags):
        return cli.server_config(argparse.Namespace(**{"pp": 1, "overlap": True, **flags}))

    assert config(topology="pp1-normal").topology == "pp1-normal"
    assert config(topology="pp4").topology == "pp4"
    assert config(topology="pp1-lora").topology == "pp1-lora"
    assert config(pp=4).topology == "pp4"
    with pytest.raises(cli.UsageError, match="contradicts --pp/--no-overlap"):
        config(topology="pp1-overlap", pp=4)
    with pytest.raises(cli.UsageError, match=r"known: pp1-overlap, pp1-normal, pp4, pp1-hicache, pp1-lora"):
        config(topology="pp2")


def test_run_names_the_registered_bug_a_failure_is():
    """``scripted-runtime run`` judges a failure as the explorer does: a
    registered bug's failure, with the operations its cause needs, is named
    (the report and the scenario printed, ``known`` in --result-json);
    another failure, or the same one without those operations, is not."""
    from scripted_runtime.user_side.result import ScriptResult

    violation = {"kind": "ContractViolation", "invariant": "pause", "step": 7,
                 "message": "a extend forward of [r3] was launched at step 7 (PP slot 0), while paused (retract)"}
    error = f"ContractViolation[pause] at step 7: {violation['message']} since step 7 (iteration 824)"
    paused = ScriptResult("s", passed=False, violation=violation, error=error,
                          control_log=[{"op": "pause_generation(retract)"}])
    assert cli.known_bug_of(paused, topology="pp4", sglang_version="0.5.23").name == "pp_pause_ignored"
    assert cli.known_bug_of(paused, topology="pp1-normal", sglang_version="0.5.23") is None
    crash = "SchedulerCrashed: AssertionError in release_kv_cache (common.py)"
    retract_then_abort = ScriptResult("s", passed=False, crashed=True, error=crash,
                                      control_log=[{"op": "pause_generation(retract)"}, {"op": "abort_all"}])
    assert cli.known_bug_of(retract_then_abort, topology="pp4",
                            sglang_version="0.5.23").name == "pp_retract_abort_adopted_decode_leak"
    alone = ScriptResult("s", passed=False, crashed=True, error=crash, control_log=[])
    assert cli.known_bug_of(alone, topology="pp4", sglang_version="0.5.23") is None
    assert cli.known_bug_of(ScriptResult("s", passed=True), topology="pp4", sglang_version="0.5.23") is None
