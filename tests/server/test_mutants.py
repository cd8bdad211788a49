"""Mutants against the real scheduler: one mutant per topology is found by a
bounded exploration (built-in ones on pp1-overlap and pp4; on pp1-normal, in
the ``mutate`` command test, a mutant from a module outside this repo,
loaded into the scheduler and found the same way, its written program
replaying with ``--patch``). (The full kill table is the ``slow`` lane:
``tests/server/test_mutants.py -m slow``.)"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scripted_runtime.hooks.patch_base import ALL_TOPOLOGIES
from scripted_runtime.user_side import mutate
from scripted_runtime.user_side.explore import explorer
from scripted_runtime.user_side.explore.explore_settings import ExploreSettings
from scripted_runtime.user_side.explore.runner import ExampleRunner, signature_of
from scripted_runtime.user_side.server_config import ServerConfig
from tests.helpers import load_bench

ROOT = Path(__file__).resolve().parents[2]

# A team's own mutant, kept in their repo: pause_generation(in_place) is
# answered but never sets the paused flag, so generation goes on. Seen by the
# pause contract; nothing crashes (a crash would cost the test a restart).
TEAM_MUTANTS = '''
from scripted_runtime.hooks.patch_base import Patch, PatchError


def _install(scheduler_module):
    cls = getattr(scheduler_module, "Scheduler", None)
    if cls is None or not hasattr(cls, "pause_generation"):
        raise PatchError("Scheduler.pause_generation not found")
    original = cls.pause_generation

    def pause_generation(self, recv_req):
        if getattr(recv_req, "mode", None) == "in_place":
            return None  # the bug: acknowledged, the flag never set
        return original(self, recv_req)

    pause_generation.__wrapped__ = original
    cls.pause_generation = pause_generation


in_place_pause_ignored = Patch(
    name="in_place_pause_ignored", summary="pause_generation(in_place) is acknowledged and ignored",
    install=_install, expected="the pause contract (a forward launched while paused)")
'''


@pytest.fixture
def team_module(tmp_path, monkeypatch):
    """A package of mutants outside this repo, importable only through its own path."""
    pkg = tmp_path / "teamkit"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mutants.py").write_text(textwrap.dedent(TEAM_MUTANTS))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


# One built-in mutant per topology, each caught by a different check.
PER_TOPOLOGY = [
    pytest.param(("pp1-overlap", "mut_chunk_alloc_ignores_held_row", "invariant slot_ownership"), id="pp1-overlap"),
    # pp4: in the slow lane (a pp4 server of its own, ~50 s); the default lane's pp4 search is the
    # PR 27446 one (tests/server/test_scenarios.py), and the kill table covers every pp4 mutant
    pytest.param(("pp4", "mut_pp_drain_first_slot_only", "invariant idle_gate"), id="pp4",
                 marks=[pytest.mark.pp4, pytest.mark.slow]),
]


@pytest.fixture(scope="module")
def mutant_server(request):
    """A server with one built-in mutant in every rank, shared by this module's tests."""
    from scripted_runtime import ScriptedServer

    topology, mutant, check = request.param
    server = ScriptedServer.start(topology=topology, patches=[mutant])
    server.mutant, server.check = mutant, check
    yield server
    server.shutdown()


@pytest.mark.parametrize("mutant_server", PER_TOPOLOGY, indirect=True)
def test_a_builtin_mutant_is_killed(mutant_server, tmp_path):
    """A short search with every check but the output oracle (whose reference
    warm-up would cost a pp4 server ~20 s; none of these mutants needs it)."""
    from scripted_runtime.scheduler_side.invariants import NAMES

    topology, mutant = mutant_server.topology, mutant_server.mutant
    report = explorer.explore(
        ServerConfig(topology, patches=(mutant,), checks=[n for n in NAMES if n != "greedy_output"]),
        ExploreSettings(profile="ci", max_examples=40, max_time_s=40.0, shrink_time_s=5.0, check_determinism=False),
        server=mutant_server, out_dir=tmp_path / "found", progress=lambda line: None)
    assert report.failed, f"{mutant} survived {report.stats.examples} programs on {topology}"
    assert mutate.caught_by(report.signature) == mutant_server.check, report.signature
    assert f"--patch {mutant}" in Path(report.scenario_path).read_text()
    # every failure met was kept as found, before shrinking, and that file replays it too
    kept = report.kept[report.signature]
    assert "as it was first found (not shrunk)" in Path(kept).read_text()
    assert signature_of(mutant_server.run(f"{kept}:program")) == report.signature


@pytest.mark.parametrize("mutant_server", PER_TOPOLOGY[:1], indirect=True)
def test_bench_explore_keeps_every_failure_it_meets(mutant_server, tmp_path):
    """bench/explore.py searches with shrinking off; a failure it meets (here
    a planted one, the mutant) is written at once, with its run, seed and
    position, and that file replays it."""
    bench = load_bench("explore")
    # With shrinking off the search ends at the first failure, so the time limit is only a bound: the
    # seed's draws are fixed, how many of them fit in a few seconds is not (CI met none in 10 s)
    rows = bench.measure(mutant_server.topology, 90.0, 1, out_dir=tmp_path, patches=[mutant_server.mutant],
                         server=mutant_server)
    assert rows["failures"], "the planted mutant was not met in 90 s"
    line = rows["failures"][0]
    m = re.match(r"run 1 \(seed 1\), program (\d+): (.+) -> (\S+)$", line)  # a signature may hold spaces
    assert m, line
    position, signature, path = m.groups()
    text = Path(path).read_text()
    assert f"program {position} of bench run 1/1 (seed 1)" in text and "Found by `bench/explore.py`" in text
    assert f"--patch {mutant_server.mutant}" in text
    # replayed as the search ran it: a program whose failure left an engine the reset after it died in
    # is written with the crash's signature (runner._settled), which only that reset shows again
    if not mutant_server.alive:
        mutant_server.restart()
    replayed = ExampleRunner(ServerConfig(mutant_server.topology, patches=(mutant_server.mutant,)),
                             server=mutant_server).run_file(path)
    assert signature_of(replayed) == signature


@pytest.mark.slow  # its own pp1-normal server through the command line: ~55 s (the default suite's 10-minute budget)
def test_mutate_command_prints_the_table_and_writes_json(team_module, tmp_path):
    """The command on pp1-normal: the unmutated baseline and a team's own
    mutant from a module outside this repo (the pp1-normal mutant of the
    default suite)."""
    out = tmp_path / "table.json"
    env = {**__import__("os").environ, "PYTHONPATH": str(team_module)}
    proc = subprocess.run(
        [sys.executable, "-m", "scripted_runtime.user_side.cli", "mutate", "--topology", "pp1-normal",
         "--patch", "teamkit.mutants:in_place_pause_ignored",
         "--max-examples", "5", "--max-time", "30", "--shrink-time", "3", "--out", str(tmp_path / "found"),
         "--same-server-replay",  # the fresh-server replay is explore's (tests/server/test_history.py); saves a start
         "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[mutate 1/2 pp1-normal (unmutated)]" in proc.stderr  # progress while it runs
    table = json.loads(out.read_text())
    rows = {r["mutant"]: r for r in table["rows"]}
    assert rows[mutate.BASELINE]["status"] == "clean"
    team = rows["teamkit.mutants:in_place_pause_ignored"]
    assert team["status"] == "killed", team
    assert team["caught_by"].startswith(("contract ", "invariant ")), team  # a check, not a crash
    # its written file, run on the same server after the reset (--same-server-replay), fails the same way (the reset
    # undoes the tokenizer's pause the failing program left, though the scheduler never paused)
    assert team["replays"] is True, team
    # the kill's program replays with the team's mutant applied again
    assert "--patch teamkit.mutants:in_place_pause_ignored" in Path(team["scenario"]).read_text()
    assert "killed 1 of 1 mutant runs (100%)" in proc.stdout


@pytest.mark.slow
def test_full_kill_table(tmp_path):
    """Every built-in mutant on every topology it applies to, ci budget, with
    the unmutated baselines: the table must be valid (no baseline failure)
    and have a row per (topology, mutant). About an hour on the 2-core box."""
    out = tmp_path / "table.json"
    proc = subprocess.run(
        [sys.executable, "-m", "scripted_runtime.user_side.cli", "mutate", "--out", str(tmp_path / "found"),
         "--topology", ",".join(ALL_TOPOLOGIES),  # pp1-hicache too: its mutants apply there only
         "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=3 * 3600)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    have = {(r["topology"], r["mutant"]) for r in rows}
    from scripted_runtime.hooks import mutants

    want = {(t, name) for name, m in mutants.MUTANTS.items() for t in m.topologies}
    assert want <= have, sorted(want - have)
