"""HiCache (SGLang's hierarchical cache) on the CPU default
(``hooks/hicache_cpu.py``) on real servers: on a pp1-hicache server the
demo and every HiCache scenario (the transfer gate and the HiCache checks
included), and in the slow lane each HiCache check against its mutant. The
parts without a server: tests/logic/test_hicache_cpu.py."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import mutate_table

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hicache_server():
    """One pp1-hicache server (HiCache on, 400-token device pool, 481-slot
    host pool) for this module's default-lane test."""
    from scripted_runtime import ScriptedServer

    server = ScriptedServer.start(topology="pp1-hicache")
    yield server
    server.shutdown()


def _run(server, target):
    result = server.run(target)
    assert result.passed, result.summary()
    return result


def test_the_demo_and_the_hicache_scenarios_pass_with_hicache_on(hicache_server):
    """On pp1-hicache: the demo; a backup written through to the host pool;
    the backup and load-back windows; host eviction with the host pool
    accounted after every iteration; PR 19177's scenario (a held load-back,
    read only after the extend batch waited on it, pending across
    iterations); a held backup under eviction pressure. Every check runs
    after every iteration, the three HiCache ones included."""
    s = "scenarios/hicache.py"
    assert _run(hicache_server, "scenarios/demo.py:chunked_then_decode").value == {"chunks": 3, "output_len": 8}
    assert _run(hicache_server, f"{s}:host_pool_holds_backups").value["host_slots_used"] >= 200
    assert _run(hicache_server, f"{s}:write_through_window").value["ongoing_write_through"] >= 1
    seen = _run(hicache_server, f"{s}:load_back_window")
    assert seen.value["consumer_indices"] and seen.windows["hicache_load_in_progress"]["reached"]
    free = _run(hicache_server, f"{s}:host_eviction_accounted").value["host_free_after_each"]
    assert free[-1] < 481 - 192, free  # the host pool filled, so the later prompts evicted older backups
    race = _run(hicache_server, f"{s}:held_load_read_by_forward").value
    assert [t["state"] for t in race["loads"]] == ["copied"] and race["loads"][0]["waited"], race
    held = _run(hicache_server, f"{s}:held_backup_survives_eviction").value
    assert held["held_backups_during_fill"] >= 1, held


# Each HiCache check against the mutant it must catch, on the scenario that
# reaches the state (tests/server/test_mutants.py's kill table finds them by search).
MUTANT_SCENARIOS = [
    ("mut_hicache_forward_skips_load_wait", "held_load_read_by_forward", "hicache_load_before_read"),
    ("mut_hicache_write_through_skips_lock", "held_backup_survives_eviction", "hicache_transfer_slots"),
    ("mut_hicache_host_evict_leaks", "host_eviction_accounted", "hicache_host_accounting"),
]


@pytest.mark.slow  # a server per mutant (~20 s each)
@pytest.mark.parametrize("mutant,scenario,check", MUTANT_SCENARIOS, ids=[m[0] for m in MUTANT_SCENARIOS])
def test_each_hicache_check_fires_on_its_mutant(mutant, scenario, check):
    from scripted_runtime import ScriptedServer

    with ScriptedServer.start(topology="pp1-hicache", patches=[mutant]) as server:
        result = server.run(f"scenarios/hicache.py:{scenario}")
    assert not result.passed and result.violation and result.violation["invariant"] == check, result.summary()


@pytest.mark.slow  # a server of its own and the ci budget (~30 s)
def test_a_ci_hicache_exploration_of_the_release_finds_nothing_and_covers_the_gate(tmp_path):
    """``explore --topology pp1-hicache --profile ci`` on the installed
    release: the seed corpus (with HiCache's held-load and held-backup
    phases) then the derandomized search; no failure (0.5.23: none, so the
    three HiCache checks are quiet on it); the gate's hold/release actions
    and the hicache_transfer phase are in the coverage table."""
    stats = tmp_path / "stats.json"
    proc = subprocess.run(
        [sys.executable, "-m", "scripted_runtime.user_side.cli", "explore", "--topology", "pp1-hicache",
         "--profile", "ci", "--out", str(tmp_path / "found"), "--stats-json", str(stats)],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "failures: none" in proc.stdout
    table = proc.stdout[proc.stdout.index("coverage, control operation"):]
    assert "hicache_transfer" in table.splitlines()[1]
    for row in ("hicache:hold", "hicache:release"):
        assert any(line.strip().startswith(row) for line in table.splitlines()), table
    import json

    report = json.loads(stats.read_text())
    assert report["status"] == "RAN" and report["stats"]["windows"]["hicache_load_in_progress"]["reached"] > 0, report


@pytest.mark.slow  # four servers and four ci searches (~2.5 min)
def test_the_explorer_kills_every_hicache_mutant(tmp_path):
    """``mutate --topology pp1-hicache``: the unmutated baseline finds
    nothing; each HiCache mutant is found by search, by the check it names,
    and its written file replays on a fresh server."""
    names = [m for m, _, _ in MUTANT_SCENARIOS]
    rows = mutate_table("pp1-hicache", tmp_path, *(a for n in names for a in ("--mutant", n)))
    for mutant, _, check in MUTANT_SCENARIOS:
        assert rows[mutant]["status"] == "killed" and rows[mutant]["caught_by"] == f"invariant {check}", rows[mutant]
        assert rows[mutant]["replays"] is True, rows[mutant]
