"""The explorer against the real scheduler.

* A ``ci``-profile exploration of every CPU topology on the installed SGLang
  passes, on the suite's pooled server, and prints its statistics.
* ``scripted-runtime explore`` on pp=4 with PR 27446 reverted finds the
  idle-gate violation without being told the window, writes a scenario, and
  that file replays the failure deterministically (slow lane: a cold pp4
  start of its own; the same search on the suite's reverted server is in
  test_scenarios.py).
* On pp=4 the live PP pause bug breaks the pause check on every program
  that pauses while a request runs: with the registry the ci exploration
  turns that check off there (``waived``), without it the bug is a new,
  shrunk finding.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from scripted_runtime import known_bugs
from scripted_runtime.user_side.explore import explorer
from scripted_runtime.user_side.explore.explore_settings import ExploreSettings
from scripted_runtime.user_side.server_config import ServerConfig
from tests.helpers import run_ok

REPO = Path(__file__).resolve().parents[2]


def test_ci_profile_exploration_passes(server, tmp_path, capsys):
    # The corpus (126 programs, 147 at pp4) and 15 generated programs, 1 at pp4 (60 and 20 until
    # grammar 13's turns took the suite past its 10 minutes: 626 s, then 623 s with 30 and 10): the
    # whole profile (60 s of search after the corpus) costs ~55 s more per topology, over the suite's
    # budget; the kill table runs it whole, and the dev-profile runs of bench/README.md measure the
    # false positives of generated programs.
    budget = {"max_examples": 1 if server.topology == "pp4" else 15}
    report = explorer.explore(server.config, ExploreSettings(profile="ci", **budget), server=server,
                              out_dir=tmp_path, progress=lambda line: print(f"[explore] {line}"))
    explorer.print_report(report, profile="ci")
    out = capsys.readouterr().out
    sys.stdout.write(out)  # the statistics stay visible with -s / in the log
    assert not report.failed, f"{report.signature}: {report.scenario_path}\n{out}"
    stats = report.stats
    for name, met in report.known.items():  # registered SGLang bugs: reported, their programs kept
        assert f"known: {name}: {met['signature']}" in out and Path(met["scenario"]).is_file()
        assert stats.known[name] >= 1
    if _pp_pause_bug_applies(server):
        # the live PP pause bug breaks the pause check on every program that pauses while a request runs:
        # the check is off here, so programs go on past it (its strict xfail checks it)
        assert report.waived == {"pause": "pp_pause_ignored"} and "waived: pp_pause_ignored" in out, out
        assert "pp_pause_ignored" not in report.known, out
    else:
        assert report.waived == {}, out
    assert stats.examples >= 10, stats.summary()
    assert stats.steps > stats.examples, stats.summary()
    # a restart only after a registered bug that leaves the server unusable (the abort-pause wedge)
    breaking = sum(n for name, n in stats.known.items() if known_bugs.by_name(name).breaks_server)
    assert stats.failures == {} and stats.restarts <= breaking, (stats.restarts, stats.known)
    assert report.determinism_ok, report.determinism_verdict
    assert "combinations exercised" in out and "programs in" in out
    exercised = int(re.search(r"(\d+) of \d+ combinations exercised", out).group(1))
    assert exercised >= 5, out
    assert server.alive


@pytest.mark.slow
def test_explore_cli_finds_pr27446_without_being_told_the_window(tmp_path):
    """From the command line, cold: its own pp4 server (~40 s to start; the
    same search on a shared server is in tests/server/test_scenarios.py)."""
    out_dir = tmp_path / "found"
    proc = subprocess.run(
        [sys.executable, "-m", "scripted_runtime.user_side.cli", "explore", "--pp", "4", "--revert-fix", "pr27446",
         "--profile", "ci", "--out", str(out_dir), "--stats-json", str(tmp_path / "stats.json")],
        capture_output=True, text=True, timeout=900, cwd=str(REPO))
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text
    assert "FAILURE: InvariantViolation[idle_gate]" in text, text
    # the registered profiler race's workaround, on a server the command started (hooks/workarounds.py)
    assert "worked around: the registered pp_profiler_stop_with_sends_in_flight" in text, text
    assert "the written file replays it on a fresh server: InvariantViolation[idle_gate]" in text, text
    assert "deterministic: two runs gave the same" in text, text
    files = list(out_dir.glob("found_pp4_invariantviolation_idle_gate_*.py"))
    assert len(files) == 1, text
    source = files[0].read_text()
    assert "--revert-fix pr27446" in source and "def program(ctx):" in source
    assert "--patch fence_pp_profiler_stop" in source  # its replay starts the server the search ran on
    assert "# <-- FAILS here" in source
    compile(source, str(files[0]), "exec")
    # The window was never named to the explorer: the program need not mention it.
    import json

    payload = json.loads((tmp_path / "stats.json").read_text())
    assert payload["signature"] == "InvariantViolation[idle_gate]" and payload["replay_matches"] is True
    assert payload["stats"]["examples"] >= 1


@pytest.mark.slow
def test_parallel_workers_merge_their_statistics(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "scripted_runtime.user_side.cli", "explore", "--no-overlap", "-n", "2", "--profile", "ci",
         "--max-examples", "20", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=900, cwd=str(REPO))
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert "=== 2 workers merged ===" in text and "[explore w0]" in text and "[explore w1]" in text, text
    assert "the workers fork their servers from it" in text, text  # one template's imports, not two
    merged = re.search(r"explored pp1-normal .*?: (\d+) programs", text.split("=== 2 workers merged ===")[1])
    assert merged and int(merged.group(1)) >= 2, text


def _pp_pause_bug_applies(server) -> bool:
    bug = known_bugs.by_name("pp_pause_ignored")
    return bug.applies(server.topology, server.info.get("sglang_version"))


@pytest.mark.pp4
def test_without_the_registry_the_pp_pause_bug_is_a_new_shrunk_finding(server_pool, tmp_path):
    server = server_pool.get("pp4")
    if not _pp_pause_bug_applies(server):
        pytest.skip(f"pp_pause_ignored is not registered for SGLang {server.info.get('sglang_version')}")
    new = explorer.explore(ServerConfig("pp4"), ExploreSettings(profile="ci", known_bugs=(), shrink_time_s=20,
                                                                check_determinism=False),
                           server=server, out_dir=tmp_path, progress=lambda line: print(f"[explore] {line}"))
    assert new.signature == "ContractViolation[pause]", new.stats.summary()
    source = Path(new.scenario_path).read_text()
    assert "pause_generation" in source and "# <-- FAILS here" in source
    assert new.replay_matches, new.replay_verdict
    print("shrunk:", *new.program_lines, sep="\n  ")


def script_join_a_busy_micro_batch(ctx, beside):
    """The explorer's source for: start (12 new tokens), 3 steps, start
    (``beside``: in the first's micro-batch), then the slot each request's
    running batch is in."""
    from scripted_runtime.user_side.explore import actions as A

    namespace = {}
    exec(A.to_source([A.Start(8, 0, 12), A.Steps(3), A.Start(8, 1, 4, beside=beside)]).text, namespace)
    gen = namespace["program"](ctx)
    slots = None
    for _ in gen:  # run its actions; read the slots once both requests decode
        handles = [h for h in gen.gi_frame.f_locals["reqs"] if not h.finished] if gen.gi_frame else []
        running = [[r.rid for r in b.reqs] if b is not None else [] for b in ctx.scheduler.running_mbs]
        held = [next((i for i, rids in enumerate(running) if h.rid in rids), None) for h in handles]
        if slots is None and len(handles) == 2 and None not in held:
            slots = held
        yield
    return slots


@pytest.mark.pp4
def test_a_start_beside_a_live_request_joins_its_micro_batch_under_pp(server_pool):
    """Start.beside steps to the live request's micro-batch slot before the
    start, so both decode in one running batch (the merge of a prefill into a
    decoding micro-batch); without it, 3 steps later the second lands in
    another slot."""
    server = server_pool.get("pp4")
    joined = run_ok(server, script_join_a_busy_micro_batch, 0).value
    assert joined is not None and joined[0] == joined[1], joined
    apart = run_ok(server, script_join_a_busy_micro_batch, None).value
    assert apart is not None and apart[0] != apart[1], apart
