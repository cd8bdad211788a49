"""Patch specs (built-in, MODULE:ATTR, PATH.py:ATTR) and the kill table's
logic, on small fakes: no SGLang server."""
from __future__ import annotations

import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from scripted_runtime.hooks import fix_toggles, patches
from scripted_runtime.hooks.patch_base import Patch, PatchError
from scripted_runtime.errors import ServerStartError
from scripted_runtime.user_side import mutate

USER_MODULE = '''
from scripted_runtime.hooks.patch_base import Patch

CALLS = []

def _install(module):
    CALLS.append(module)

planted = Patch(name="planted", summary="records the module it was given", install=_install,
                topologies=("pp1-normal",), expected="invariant pool_accounting")

def plain(module):
    """A bare function is a patch too; this line is its summary."""
    CALLS.append(("plain", module))

NOT_A_PATCH = 3
'''


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    pkg = tmp_path / "teampkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mutants.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_builtin_names_cover_fix_toggles_and_mutants_without_clash():
    names = patches.builtin_names()
    assert set(fix_toggles.TOGGLES) <= set(names)
    assert patches.check("pr27446").spec == "pr27446"


def test_unknown_builtin_names_what_is_known():
    with pytest.raises(ValueError, match=r"unknown patch 'nope'; built-in: .*pr27446"):
        patches.check("nope")
    with pytest.raises(ValueError, match="expected NAME, MODULE:ATTR or PATH.py:ATTR"):
        patches.check("mod:not an identifier")


def test_module_spec_resolves_its_search_root_without_importing(user_package):
    resolved = patches.check("teampkg.mutants:planted")
    assert resolved.spec == "teampkg.mutants:planted"
    assert Path(resolved.search_path) == user_package
    with pytest.raises(ValueError, match="module 'teampkg.nothere' not found"):
        patches.check("teampkg.nothere:planted")


def test_path_spec_is_made_absolute_and_checked_for_the_name(user_package, monkeypatch):
    monkeypatch.chdir(user_package)
    assert patches.check("teampkg/mutants.py:planted").spec == f"{user_package}/teampkg/mutants.py:planted"
    with pytest.raises(ValueError, match="defines no 'absent'"):
        patches.check("teampkg/mutants.py:absent")
    with pytest.raises(ValueError, match="file not found"):
        patches.check("teampkg/none.py:planted")


def test_load_and_install_a_users_patch_objects_and_functions(user_package, monkeypatch):
    planted = patches.load("teampkg.mutants:planted")
    assert isinstance(planted, Patch) and planted.topologies == ("pp1-normal",)
    plain = patches.load(f"{user_package}/teampkg/mutants.py:plain")
    assert plain.name == "plain" and plain.summary.startswith("A bare function is a patch too")
    with pytest.raises(PatchError, match="is a int, not a Patch"):
        patches.load("teampkg.mutants:NOT_A_PATCH")
    monkeypatch.setenv(patches.ENV_PATCHES, "teampkg.mutants:planted,teampkg.mutants:plain")
    fake_scheduler_module = object()
    patches.install_requested(fake_scheduler_module)
    import teampkg.mutants as m

    assert m.CALLS == [fake_scheduler_module, ("plain", fake_scheduler_module)]


def test_caught_by_names_the_check():
    assert mutate.caught_by("InvariantViolation[slot_ownership]") == "invariant slot_ownership"
    assert mutate.caught_by("SchedulerCrashed: AssertionError: x") == "crash"
    assert mutate.caught_by("EndStateError: request r0 never finished") == "end-state check"
    assert mutate.caught_by("server start: boom") == "server start"
    assert mutate.caught_by("ResetError: the reset's close_session('s') was processed") == "reset"
    assert mutate.caught_by("LogprobContractError: request <rid>") == "logprob contract"
    assert mutate.caught_by("WeightVersionError: request <rid>") == "weight-version contract"
    assert mutate.caught_by("") == ""


def _fake_explore(outcomes):
    """explore() stand-in: ``outcomes`` maps (topology, patch or None) to a
    signature (killed), None (clean), or an exception to raise."""
    calls = []

    def explore(config, settings, **kw):
        topology, patches = config.topology, config.patches
        calls.append((topology, tuple(patches), settings.check_determinism))
        what = outcomes.get((topology, patches[0] if patches else None))
        if isinstance(what, Exception):
            raise what
        stats = SimpleNamespace(examples=42)
        return SimpleNamespace(failed=what is not None, signature=what, stats=stats, first_failure_s=3.5,
                               found_after_examples=7, scenario_path="f.py" if what else None,
                               replay_matches=True if what else None,
                               worked_around={"fence_pp_profiler_stop": "pp_profiler_stop_with_sends_in_flight"}
                               if topology == "pp4" else {})

    return explore, calls


def test_run_table_runs_the_baseline_first_then_each_applicable_mutant(user_package):
    explore, calls = _fake_explore({
        ("pp1-normal", "teampkg.mutants:planted"): "InvariantViolation[pool_accounting]",
        ("pp1-normal", "pr27446"): None,
        ("pp4", "pr27446"): ServerStartError("fix toggle pr27446: not found\nmore"),
    })
    said = []
    rows = mutate.run_table(topologies=["pp1-normal", "pp4"], mutants=["teampkg.mutants:planted", "pr27446"],
                            explore_fn=explore, progress=said.append)
    # planted declares pp1-normal only: not run on pp4, and the progress says so.
    assert [line for line in said if "left out" in line] == [
        "[mutate] 1 mutant(s) left out on pp4 (cpu): their topologies do not name it, or the code they break "
        "cannot run there: teampkg.mutants:planted"]
    assert [(t, p) for t, p, _ in calls] == [("pp1-normal", ()), ("pp1-normal", ("teampkg.mutants:planted",)),
                                             ("pp1-normal", ("pr27446",)), ("pp4", ()), ("pp4", ("pr27446",))]
    assert all(det is False for _, _, det in calls)
    status = {(r.topology, r.mutant): r for r in rows}
    killed = status[("pp1-normal", "teampkg.mutants:planted")]
    assert (killed.status, killed.caught_by, killed.seconds_to_kill, killed.programs, killed.replays) == (
        "killed", "invariant pool_accounting", 3.5, 7, True)
    assert killed.expected == "invariant pool_accounting"
    assert status[("pp1-normal", "pr27446")].status == "survived"
    assert status[("pp1-normal", "pr27446")].programs == 42
    start = status[("pp4", "pr27446")]
    assert start.status == "killed-at-start" and start.signature == "server start: fix toggle pr27446: not found"
    # a row says which registered bug's workaround its servers ran with (in the --json rows)
    assert status[("pp4", "(unmutated)")].worked_around == ("fence_pp_profiler_stop",)
    assert killed.worked_around == ()
    assert mutate.as_json(rows)["rows"][3]["worked_around"] == ("fence_pp_profiler_stop",)
    assert mutate.void_topologies(rows) == []
    s = mutate.summary(rows)
    assert (s["mutant_runs"], s["killed"], s["median_seconds_to_kill"]) == (3, 2, 3.5)
    table = mutate.format_table(rows)
    assert "killed 2 of 3 mutant runs (67%)" in table and "VOID" not in table and "did NOT replay" not in table
    assert " | replays | " in table.splitlines()[0]
    planted_line = next(l for l in table.splitlines() if "teampkg.mutants:planted" in l)
    assert "| yes " in planted_line


def test_a_kill_that_does_not_replay_is_named_beside_the_rate():
    explore, _ = _fake_explore({("pp1-normal", "pr27446"): "HarnessTimeout: script hung",
                                ("pp1-normal", "pr17850"): "InvariantViolation[slot_ownership]"})

    def not_replaying(config, settings, **kw):
        report = explore(config, settings, **kw)
        if config.patches == ("pr27446",):
            report.replay_matches = False
        return report

    rows = mutate.run_table(topologies=["pp1-normal"], mutants=["pr27446", "pr17850"], explore_fn=not_replaying,
                            progress=lambda line: None)
    s = mutate.summary(rows)
    assert (s["killed"], s["killed_replaying"], s["unreplayed"]) == (2, 1, ["pr27446"])
    table = mutate.format_table(rows)
    assert "killed 2 of 2 mutant runs (100%)" in table
    assert "1 kill did NOT replay on a fresh server (pr27446): 1 of 2 (50%) killed by a failure that replays" in table
    line = next(l for l in table.splitlines() if "| pr27446 " in l)
    assert "| NO " in line


def test_a_baseline_failure_voids_the_table():
    explore, _ = _fake_explore({("pp1-overlap", None): "SchedulerCrashed: AssertionError: x"})
    rows = mutate.run_table(topologies=["pp1-overlap"], mutants=[], explore_fn=explore,
                            progress=lambda line: None)
    assert rows[0].status == "FAILED"
    assert mutate.void_topologies(rows) == ["pp1-overlap"]
    assert "VOID on pp1-overlap" in mutate.format_table(rows)


def test_a_mutant_is_left_out_where_the_code_it_breaks_cannot_run():
    # the tensor update cannot run under PP on CPU (ctx refuses it): its mutant has no pp4 row
    # there, and has one on a GPU runner
    assert not mutate.applicable("mut_tensor_update_skips_flush", "pp4", "cpu")
    assert mutate.applicable("mut_tensor_update_skips_flush", "pp4", "cuda")
    assert mutate.applicable("mut_tensor_update_skips_flush", "pp1-overlap", "cpu")
    explore, calls = _fake_explore({})
    mutate.run_table(topologies=["pp4"], mutants=["mut_tensor_update_skips_flush", "mut_abort_keeps_row"],
                     explore_fn=explore, progress=lambda line: None)
    assert [p for _, p, _ in calls] == [(), ("mut_abort_keeps_row",)]
