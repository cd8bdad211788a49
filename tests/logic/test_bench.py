"""The benches' own logic: the shared statistics and tables (bench/stats.py),
the process-tree bookkeeping (bench/proctree.py), bench/compare.py's figures
and pairing policy, each bench's table, bench/invariants.py's round order
(default lane); and one short end-to-end comparison of all four systems on
the real SGLang (slow lane: SGLang's own harness takes 60 s to shut down)."""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import load_bench

ROOT = Path(__file__).resolve().parents[2]


stats = load_bench("stats")
proctree = load_bench("proctree")
compare = load_bench("compare")
invariants_bench = load_bench("invariants")
iteration_cost = load_bench("iteration_cost")
cold_warm = load_bench("cold_warm")
decode_gap = load_bench("decode_gap")
explore_bench = load_bench("explore")
novelty_bench = load_bench("novelty")


# --- bench/stats.py ---------------------------------------------------------------
def test_spread_is_the_median_and_range_and_a_lone_value_stands_alone():
    assert stats.spread([3.0, 1.0, 2.0, 10.0]) == "2.50 (1.00..10.00)"
    assert stats.spread([0.95, 0.9, 1.0], "{:.3f}x") == "0.950x (0.900x..1.000x)"
    assert stats.spread([4.0]) == "4.00" and stats.spread([]) == "n/a"
    assert stats.min_max([3.0, 1.2, 2.0]) == "1..3"
    assert stats.min_max([0.5, 0.25], "{:.2f}") == "0.25..0.50"


def test_quartiles_are_inclusive_and_a_lone_value_stands_alone():
    # inclusive quartiles of 1..5 are 2, 3, 4; of 1..4 they are 1.75, 2.5, 3.25
    assert stats.quartiles([5.0, 1.0, 4.0, 2.0, 3.0]) == "3.000x (2.000x..4.000x)"
    assert stats.quartiles([1.0, 2.0, 3.0, 4.0], "{:.2f}") == "2.50 (1.75..3.25)"
    assert stats.quartiles([0.9, 0.95, 0.9]) == "0.900x (0.900x..0.925x)"
    assert stats.quartiles([0.97]) == "0.970x" and stats.quartiles([]) == "n/a"


def test_ratios_are_taken_pair_by_pair_skipping_a_zero_denominator():
    assert stats.ratios([2.0, 3.0, 5.0], [1.0, 3.0, 0.0]) == [2.0, 1.0]
    assert stats.ratios([1.0, 2.0], [2.0]) == [0.5]  # pairs only
    assert stats.meets([0.9, 1.0, 0.96], ">=", 0.95) and not stats.meets([0.9, 1.0, 0.94], ">=", 0.95)
    assert stats.meets([1.2, 1.0, 1.1], "<=", 1.1) and not stats.meets([1.2, 1.0, 1.15], "<=", 1.1)


def test_verdict_judges_the_median_and_names_what_missed():
    assert stats.verdict([("vs x", [1.2, 0.9, 1.0], "<=", 1.1)]) == "met"
    assert stats.verdict([("vs x", [1.2, 1.3, 1.0], "<=", 1.1)]) == "**NOT met**: vs x 1.20"
    assert stats.verdict([("vs a", [0.97], ">=", 0.95), ("vs b", [0.90], ">=", 0.95)]) == "**NOT met**: vs b 0.90"
    # a comparison with no figure is named, the others still judge
    assert stats.verdict([("vs a", [0.97], ">=", 0.95), ("vs b", [], ">=", 0.95)]) == "met (no figure vs b)"
    assert stats.verdict([("vs b", [], ">=", 0.95)]) == "n/a (no vs b)"
    assert stats.verdict([]) == ""


def test_rotation_puts_each_item_first_in_turn():
    assert [stats.rotated("abc", i) for i in range(4)] == [list("abc"), list("bca"), list("cab"), list("abc")]
    assert stats.rotated(("x", "y"), 1) == ["y", "x"] and stats.rotated([], 3) == []


def test_wall_times_times_each_call():
    calls = []
    times = stats.wall_times(lambda: (calls.append(1), time.sleep(0.01)), 3)
    assert len(calls) == 3 and len(times) == 3 and all(0.009 < t < 1.0 for t in times)


def test_md_table_renders_header_rule_and_rows():
    assert stats.md_table(["a", "b"], [["1", ""], ["x y", "2.0 (1.0..3.0)"]]) == (
        "| a | b |\n"
        "|---|---|\n"
        "| 1 |  |\n"
        "| x y | 2.0 (1.0..3.0) |")


def test_machine_line_names_date_commit_release_and_machine():
    line = stats.machine_line(sglang_version="0.0.test")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d, commit ([0-9a-f]{4,}(\+dirty)?|unknown), sglang 0\.0\.test, "
                        r"\d+ cores \(\S+, \d+ GiB\)", line), line


# --- bench/proctree.py ------------------------------------------------------------
def test_process_tree_is_followed_and_what_outlives_it_is_named():
    # a shell that starts a grandchild and exits: the grandchild is reparented
    # away from the tree, yet it was seen, so it counts as left behind
    proc = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 0.5"], start_new_session=True)
    try:
        time.sleep(0.2)
        tree = proctree.descendants(proc.pid)
        assert proc.pid in tree and len(tree) >= 2
        rss, pss = proctree.memory_mib(tree)
        assert rss > 0 and pss > 0
        proc.wait(timeout=5)
        left = proctree.alive(tree, exclude=proc.pid)
        assert len(left) == 1 and left[0] != proc.pid
    finally:
        proctree.kill_all(list(proctree.descendants(proc.pid)) + proctree.alive(tree, exclude=-1))
        time.sleep(0.2)
    assert proctree.alive(tree, exclude=-1) == []
    assert proctree.mem_available_mib() > 0


# --- bench/compare.py ---------------------------------------------------------------
def test_decode_length_is_counted_in_scheduler_iterations():
    assert compare.decode_tokens_for("pp1-overlap", 400) == 400
    # pp_size 4 + async depth 2: a lone request gets a token every 6 slots
    assert compare.decode_tokens_for("pp4", 400) == 67


def test_ratios_are_taken_within_each_repeat():
    runs = [{("harness", "t"): {"x": 2.0}, ("engine", "t"): {"x": 1.0}},
            {("harness", "t"): {"x": 3.0}, ("engine", "t"): {"x": 3.0}},
            {("harness", "t"): {"x": 5.0}}]  # the engine missing in this repeat: no ratio
    r = compare.per_repeat(runs, "harness", "engine", "t", lambda rep: rep["x"])
    assert r == [2.0, 1.0]
    assert stats.spread(r, "{:.2f}x") == "1.50x (1.00x..2.00x)"


def test_paired_set_keeps_up_only_what_fits_ours_and_its_plain_server_first():
    four = ["engine", "upstream", "harness", "server"]
    # pp=1 on this box: every tree fits
    assert compare.paired_set(four, 3500.0, 23000.0) == four
    # pp=4: three trees' room; two stay up, one start's room is left
    assert compare.paired_set(four, 6000.0, 22600.0) == ["harness", "server"]
    # fewer than two would be paired: nobody is
    assert compare.paired_set(four, 9000.0, 22600.0) == []
    assert compare.paired_set(["engine", "server"], 3500.0, 23000.0) == ["engine", "server"]


def test_tree_estimate_comes_from_measured_pss_else_the_guess():
    assert compare.tree_mib_estimate([], "pp1-overlap") == compare.TREE_MIB_GUESS[1]
    assert compare.tree_mib_estimate([], "pp4") == compare.TREE_MIB_GUESS[4]
    runs = [{("harness", "pp4"): {"quiet_pss_mib": 5000.0}, ("server", "pp4"): {"quiet_pss_mib": 4000.0},
             ("harness", "pp1-overlap"): {"quiet_pss_mib": 100.0}}]
    assert compare.tree_mib_estimate(runs, "pp4") == pytest.approx(5750.0)


def test_paired_rates_read_ours_per_configuration_and_plain_runs_directly():
    ours = {"paired": [{"configs": {"bare": {"tokens": 400, "wall_s": 1.0}, "default": {"tokens": 400, "wall_s": 2.0}}},
                       {"configs": {"bare": {"tokens": 400, "wall_s": 0.5}, "default": {"tokens": 400, "wall_s": 1.0}}}]}
    plain = {"paired": [{"tokens": 400, "wall_s": 1.0}, {"tokens": 400, "wall_s": 2.0}, {"tokens": 400, "wall_s": 4.0}]}
    assert compare.paired_tps("bare")(ours) == 600.0
    assert compare.paired_tps("default")(ours) == 300.0
    assert compare.paired_tps()(plain) == 200.0
    with pytest.raises(KeyError):
        compare.paired_tps()({"decode": {}})  # ran unpaired: no figure, not a zero
    # the alone decodes: a system's rate is the median of its runs
    rep = {"decode": {"plain": [{"tokens": 100, "wall_s": 1.0}, {"tokens": 100, "wall_s": 0.5},
                                {"tokens": 100, "wall_s": 0.25}]}}
    assert compare.tokens_per_s("plain")(rep) == 200.0


def test_invariants_bench_shuffles_each_round_the_same_way_on_a_rerun():
    names = list(invariants_bench.configurations(gc_off=True))
    assert names == ["bare", "invariants", "hicache", "contracts", "trace", "default", "default-gc-off"]
    orders = [invariants_bench.round_order(names, i) for i in range(8)]
    assert all(sorted(o) == sorted(names) for o in orders)  # every configuration once a round
    assert len({tuple(o) for o in orders}) > 1  # not one fixed order
    assert len({o[0] for o in orders}) > 1  # not always the same one first after the previous round
    assert orders == [invariants_bench.round_order(names, i) for i in range(8)]  # seeded: a re-run repeats it


def test_invariants_bench_configurations_switch_what_they_name():
    cfg = invariants_bench.configurations(gc_off=False)
    assert "default-gc-off" not in cfg
    assert cfg["bare"] == {"invariants": False, "trace": False, "gc": True}
    assert cfg["trace"] == {"invariants": False, "trace": True, "gc": True}
    assert cfg["default"] == {"invariants": True, "trace": True, "gc": True}
    from scripted_runtime.scheduler_side.invariants import CONTRACT_NAMES, INVARIANT_NAMES

    assert cfg["invariants"]["invariants"] == list(INVARIANT_NAMES)  # the invariants, no contract
    assert cfg["contracts"]["invariants"] == list(CONTRACT_NAMES)
    from scripted_runtime.scheduler_side import hicache_checks

    assert cfg["hicache"]["invariants"] == list(hicache_checks.NAMES) and set(hicache_checks.NAMES) < set(
        INVARIANT_NAMES)
    assert invariants_bench.configurations(gc_off=True)["default-gc-off"]["gc"] is False


def test_invariants_bench_ratios_are_taken_within_each_round():
    rates = {"bare": [500.0, 400.0, 600.0], "default": [450.0, 380.0, 540.0]}
    ratios = invariants_bench.within_round_ratios(rates)
    assert ratios["bare"] == [1.0, 1.0, 1.0]
    assert ratios["default"] == pytest.approx([0.9, 0.95, 0.9])


# --- each bench's table -----------------------------------------------------------
def _wall(tokens: int, wall_s: float, steps: int = 0) -> dict:
    return {"tokens": tokens, "wall_s": wall_s, "steps": steps or tokens}


def test_compare_table_rows_ratios_and_verdicts():
    def rep(start_s: float, decode_wall: float, config: str, short_s: float) -> dict:
        return {"start_s": start_s, "decode": {config: [_wall(100, decode_wall)]}, "short": {config: [short_s]},
                "shutdown_s": 0.5, "left_after_shutdown": [], "left_after_exit": [], "peak_rss_mib": 1000.0,
                "quiet_pss_mib": 800.0}

    def ours(start_s: float) -> dict:
        r = rep(start_s, 0.2, "default", 0.02)
        r["decode"].update(bare=[_wall(100, 0.16)], invariants=[_wall(100, 0.18)])
        r["short"]["bare"] = [0.01]
        return r

    # two repeats of ours and the plain launch_server; no Engine, no upstream harness
    runs = [{("harness", "t"): ours(10.0), ("server", "t"): rep(10.0, 0.18, "plain", 0.01)},
            {("harness", "t"): ours(11.0), ("server", "t"): rep(10.0, 0.18, "plain", 0.01)}]
    args = argparse.Namespace(paired_rounds=0, decode_steps=100, decode_runs=1, short_runs=1)
    lines = compare.table(runs, ["t"], args).splitlines()
    assert lines[0] == ("| topology | figure | harness | upstream harness | plain launch_server | plain Engine | "
                        "harness / launch_server | harness / Engine | harness / upstream | target | verdict |")
    assert lines[1] == "|" + "---|" * 11
    rows = {cells[1]: cells for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:])}
    assert len(lines) == 2 + len(rows) == 2 + 13 and all(len(cells) == 11 for cells in rows.values())
    # the per-repeat ratios 1.0 and 1.1, judged on their median
    assert rows["start to first script (s)"] == [
        "t", "start to first script (s)", "10.5 (10.0..11.0)", "n/a", "10.0 (10.0..10.0)", "n/a",
        "1.05x (1.00x..1.10x)", "n/a", "n/a", "<= 1.1x plain launch_server", "met"]
    # without paired turns the decode alone is judged: 500 tokens/s against 556
    assert rows["decode tokens/s, each system alone (median of 1 runs), harness as `run` does"][2:] == [
        "500.0 (500.0..500.0)", "n/a", "555.6 (555.6..555.6)", "n/a", "0.90x (0.90x..0.90x)", "n/a", "n/a",
        ">= 0.95x plain", "**NOT met**: vs plain launch_server 0.90 (no figure vs plain Engine)"]
    assert rows["harness decode rate, invariants on / off"][2:] == [
        "0.89x (0.89x..0.89x) (no trace), 0.80x (0.80x..0.80x) (with trace)"] + [""] * 8
    assert rows["shutdown (s)"][2:] == [
        "0.50 (0.50..0.50)", "n/a", "0.50 (0.50..0.50)", "n/a", "1.00x (1.00x..1.00x)", "n/a", "n/a",
        "<= upstream, < 5 s", "met (no figure vs upstream harness)"]
    # 0 / 0 is no ratio; the target is on ours alone
    assert rows["processes left after the process exited"][2:] == [
        "0 (0..0)", "n/a", "0 (0..0)", "n/a", "n/a", "n/a", "n/a", "0", "met"]


def test_decode_gap_table():
    walls = {"plain": [0.8, 1.0, 0.9], "harness, free-running": [0.8, 1.0, 0.9],
             "harness, bare script": [0.8, 1.0, 1.0], "harness, default script": [1.0, 1.0, 1.0]}
    assert decode_gap.table("pp1-overlap", 400, walls) == "\n".join([
        "| pp1-overlap | figure | decode wall, 400 tokens (s) | tokens/s | / plain (per round) | target |",
        "|---|---|---|---|---|---|",
        "|  | plain | 0.900 (0.800..1.000) | 444 | 1 |  |",
        "|  | harness, free-running | 0.900 (0.800..1.000) | 444 | 1.000x (1.000x..1.000x) |  |",
        "|  | harness, bare script | 1.000 (0.800..1.000) | 400 | 1.000x (0.900x..1.000x) | >= 0.95x: met |",
        "|  | harness, default script | 1.000 (1.000..1.000) | 400 | 0.900x (0.800x..1.000x) "
        "| >= 0.95x: **NOT met** |"])


def test_invariants_table():
    results = {"pp1": {"bare": [500.0, 400.0, 600.0], "default": [450.0, 380.0, 540.0]}}
    assert invariants_bench.table(results) == "\n".join([
        "| topology | configuration | decode steps/s median | min..max | / bare within a round, median (q1..q3) "
        "| us/iteration | us over bare |",
        "|---|---|---|---|---|---|---|",
        "| pp1 | bare | 500 | 400..600 | 1.000x (1.000x..1.000x) | 2000 | +0 |",
        "| pp1 | default | 450 | 380..540 | 0.900x (0.900x..0.925x) | 2222 | +222 |"])


def test_iteration_cost_table_orders_pieces_and_leaves_out_what_a_configuration_did_not_run():
    walls = {"bare": [4000.0, 4100.0, 3900.0], "default": [4150.0, 4200.0, 4100.0]}
    pieces = {"bare": {"driver: before_iteration (all)": [70.0, 80.0, 75.0], "check: x": [0.0, 0.0, 0.01]},
              "default": {"check: x": [40.0, 50.0, 45.0], "driver: before_iteration (all)": [230.0, 240.0, 235.0]}}
    assert iteration_cost.tables({"pp1": (walls, pieces)}) == "\n".join([
        "| topology | piece | us/iteration median | min..max |",
        "|---|---|---|---|",
        "| pp1 | wall: default - bare (within a round) | +150.0 | +100..+200 |",
        "| pp1 | wall: bare | 4000 | 3900..4100 |",
        "| pp1 | wall: default | 4150 | 4100..4200 |",
        "| pp1 | bare: driver: before_iteration (all) | 75.0 | 70.0..80.0 |",
        "| pp1 | default: driver: before_iteration (all) | 235.0 | 230.0..240.0 |",
        "| pp1 | default: check: x | 45.0 | 40.0..50.0 |"])


def test_cold_warm_table_gives_each_piece_per_pass_and_their_sum():
    # two iterations, a cold pass and one warm pass each, ns per piece
    rows = [[[10_000, 30_000, 10_000, 4_000, 8_000], [5_000, 10_000, 4_000, 2_000, 5_000]],
            [[12_000, 40_000, 12_000, 6_000, 10_000], [7_000, 8_000, 6_000, 2_000, 7_000]]]
    assert cold_warm.table({"pp1": rows}) == "\n".join([
        "| topology | piece | cold (right after the forward) | warm 1 |",
        "|---|---|---|---|",
        "| pp1 | StateView (scan) | 11.0 | 6.0 |",
        "| pp1 | check_slot_ownership | 35.0 | 9.0 |",
        "| pp1 | check_pool_accounting | 11.0 | 5.0 |",
        "| pp1 | check_radix_locks | 5.0 | 2.0 |",
        "| pp1 | trace snapshot | 9.0 | 6.0 |",
        "| pp1 | the five pieces above | 71.0 | 28.0 |",
        "| pp1 | iterations | 2 |  |"])


def test_explore_table():
    shares = {p: [10.0, 20.0, 30.0] for p in explore_bench.PARTS.values()}
    rows = {"pp1-overlap": {"topology": "pp1-overlap", "rates": [1200.0, 1185.4, 1264.0], "steps_per": [18.5],
                            "shares": shares, "start_s": 18.2},
            "pp4": {"topology": "pp4", "rates": [2.0, 29.0, 20.0], "steps_per": [28.94], "shares": shares,
                    "start_s": 32.0},
            # --checks on,off labels a row by its mode; its target is still its topology's
            "pp4 (checks off)": {"topology": "pp4", "rates": [31.0, 40.0, 35.0], "steps_per": [28.94],
                                 "shares": shares, "start_s": 32.0}}
    assert explore_bench.table(rows) == "\n".join([
        "| topology | programs/min median | min..max | target | steps/program | steps % | HTTP % | resets % | IPC % "
        "| Hypothesis % | server start (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        "| pp1-overlap | 1200 | 1185..1264 | >= 100 (met) | 18.5 | 20 | 20 | 20 | 20 | 20 | 18 |",
        "| pp4 | 20 | 2..29 | >= 30 (MISSED) | 28.9 | 20 | 20 | 20 | 20 | 20 | 32 |",
        "| pp4 (checks off) | 35 | 31..40 | >= 30 (met) | 28.9 | 20 | 20 | 20 | 20 | 20 | 32 |"])


# --- bench/novelty.py ---------------------------------------------------------------
def test_novelty_bench_runs_explore_twice_with_the_same_budget_and_seed(tmp_path):
    args = novelty_bench.parse_args(["--topology", "pp4", "--minutes", "2", "--seed", "7", "--out", str(tmp_path)])
    guided, unguided = (novelty_bench.explore_command(args, label, extra) for label, extra in novelty_bench.RUNS)
    assert guided[2:4] == ["scripted_runtime.user_side.cli", "explore"]
    for cmd in (guided, unguided):
        assert cmd[4:6] == ["--pp", "4"]
        assert cmd[cmd.index("--max-time") + 1] == "120" and cmd[cmd.index("--seed") + 1] == "7"
        assert cmd[cmd.index("--database") + 1] == "none" and "--no-corpus" not in cmd
    assert "--no-novelty" in unguided and "--no-novelty" not in guided
    assert guided[guided.index("--stats-json") + 1] == str(tmp_path / "guided.json")
    assert unguided[unguided.index("--out") + 1] == str(tmp_path / "unguided")
    no_corpus = novelty_bench.parse_args(["--no-corpus"])
    assert no_corpus.topology == "pp1-overlap" and no_corpus.minutes == 5.0
    assert "--no-corpus" in novelty_bench.explore_command(no_corpus, "guided", [])
    with pytest.raises(SystemExit):
        novelty_bench.parse_args(["--minutes", "0"])
    with pytest.raises(SystemExit):
        novelty_bench.parse_args(["--topology", "pp2"])


def test_novelty_table_compares_states_by_minute_and_programs(tmp_path, capsys):
    guided = {"status": "RAN", "signature": None, "stats": {
        "wall_s": 301.0, "examples": 900, "novel_programs": 40, "guided_programs": 300, "novelty": True,
        "states": {"a": 5.0, "b": 59.0, "c": 61.0, "d": 250.0}}}
    unguided = {"status": "RAN", "signature": "InvariantViolation[idle_gate]", "stats": {
        "wall_s": 100.0, "examples": 300, "novel_programs": 12, "guided_programs": 0, "novelty": False,
        "states": {"a": 9.0, "b": 90.0}}}
    paths = []
    for name, data in (("g.json", guided), ("u.json", unguided)):
        (tmp_path / name).write_text(json.dumps(data))
        paths.append(str(tmp_path / name))
    assert novelty_bench.main(["--from-json", *paths]) == 0
    assert capsys.readouterr().out.strip() == "\n".join([
        "| run | states at 1 min | states at 2 min | states at 5 min | states in all | programs run | novel programs "
        "| mutated from them | search (s) |",
        "|---|---|---|---|---|---|---|---|---|",
        "| guided | 2 | 3 | 4 | 4 | 900 | 40 | 300 | 301 |",
        "| unguided (--no-novelty) (stopped: InvariantViolation[idle_gate]) | 1 | - | - | 2 | 300 | 12 | - | 100 |"])
    (tmp_path / "x.json").write_text('{"status": "NO-START", "error": "no server"}')
    with pytest.raises(ValueError, match="did not run"):
        novelty_bench.load_stats(tmp_path / "x.json")

