"""bench/compare.py: the process-tree bookkeeping and statistics on their own
(default lane), and one short end-to-end comparison of all four systems on
the real SGLang (slow lane: SGLang's own harness takes 60 s to shut down)."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_bench(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


compare = load_bench("compare")
invariants_bench = load_bench("invariants")


def test_process_tree_is_followed_and_what_outlives_it_is_named():
    # a shell that starts a grandchild and exits: the grandchild is reparented
    # away from the tree, yet it was seen, so it counts as left behind
    proc = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 0.5"], start_new_session=True)
    try:
        time.sleep(0.2)
        tree = compare.descendants(proc.pid)
        assert proc.pid in tree and len(tree) >= 2
        rss, pss = compare.memory_mib(tree)
        assert rss > 0 and pss > 0
        proc.wait(timeout=5)
        left = compare.alive(tree, exclude=proc.pid)
        assert len(left) == 1 and left[0] != proc.pid
    finally:
        compare.kill_all(list(compare.descendants(proc.pid)) + compare.alive(tree, exclude=-1))
        time.sleep(0.2)
    assert compare.alive(tree, exclude=-1) == []


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
    assert compare.spread(r, "{:.2f}x") == "1.50x (1.00x..2.00x)"
    assert compare.spread([4.0]) == "4.00" and compare.spread([]) == "n/a"


def test_verdict_judges_the_median_and_names_what_missed():
    assert compare.verdict([("vs x", [1.2, 0.9, 1.0], "<=", 1.1)]) == "met"
    assert compare.verdict([("vs x", [1.2, 1.3, 1.0], "<=", 1.1)]) == "**NOT met**: vs x 1.20"
    assert compare.verdict([("vs a", [0.97], ">=", 0.95), ("vs b", [0.90], ">=", 0.95)]) == "**NOT met**: vs b 0.90"
    # a comparison with no figure is named, the others still judge
    assert compare.verdict([("vs a", [0.97], ">=", 0.95), ("vs b", [], ">=", 0.95)]) == "met (no figure vs b)"
    assert compare.verdict([("vs b", [], ">=", 0.95)]) == "n/a (no vs b)"
    assert compare.verdict([]) == ""


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
    assert names == ["bare", "invariants", "trace", "default", "default-gc-off"]
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
    assert invariants_bench.configurations(gc_off=True)["default-gc-off"]["gc"] is False


def test_invariants_bench_ratios_are_taken_within_each_round():
    rates = {"bare": [500.0, 400.0, 600.0], "default": [450.0, 380.0, 540.0]}
    ratios = invariants_bench.within_round_ratios(rates)
    assert ratios["bare"] == [1.0, 1.0, 1.0]
    assert ratios["default"] == pytest.approx([0.9, 0.95, 0.9])
    assert invariants_bench.quartiles(ratios["default"]) == "0.900x (0.900x..0.925x)"
    assert invariants_bench.quartiles([0.97]) == "0.970x" and invariants_bench.quartiles([]) == "n/a"


@pytest.mark.slow
@pytest.mark.sglang
def test_compare_runs_all_four_systems_and_prints_the_table():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "compare.py"), "--topologies", "pp1-overlap", "--repeat", "1",
         "--decode-steps", "20", "--decode-runs", "1", "--short-runs", "2", "--paired-rounds", "1",
         "--explore-seconds", "0"],
        capture_output=True, text=True, timeout=1500, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = {}
    for line in proc.stdout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 11 and cells[0] == "pp1-overlap":
            table[cells[1]] = cells[2:]
    start = table["start to first script (s)"]
    assert all(re.fullmatch(r"\d+\.\d", c) for c in start[:4]), start  # all four systems started
    paired = table["decode tokens/s (20-step script), paired turns, harness invariants + trace, as `run` does"]
    assert all(float(c) > 0 for c in paired[:4]), paired  # all four decoded in turns
    assert table["processes left after the process exited"][:4] == ["0", "0", "0", "0"]
    assert float(table["shutdown (s)"][0]) < 5.0
    assert table["shutdown (s)"][-1].startswith("met"), table["shutdown (s)"]
