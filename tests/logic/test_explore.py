"""The explorer's pure parts: program source, failure signatures, trace
normalization, statistics, the worker command line. No server."""
from __future__ import annotations

import ast
from types import SimpleNamespace

import pytest
from hypothesis import given, settings

from scripted_runtime.user_side.explore import actions as A
from scripted_runtime.user_side.explore import determinism, runner, strategies
from scripted_runtime.user_side.explore.explore_settings import ExploreSettings
from scripted_runtime.user_side.explore import stats as stats_mod
from scripted_runtime.user_side.explore.stats import Stats
from scripted_runtime.user_side.server_config import ServerConfig
from scripted_runtime.user_side.result import ScriptResult

PROGRAM = [A.Start(100, 1, 4), A.Steps(3), A.Flush(), A.Pause("retract"), A.Start(8, 2, 2),
           A.OnWindow("finished_not_pruned", A.UpdateWeights(True), 24), A.AbortOne(1), A.Continue()]


def test_source_compiles_and_maps_lines_to_actions():
    source = A.to_source(PROGRAM, docstring="header")
    tree = ast.parse(source.text)
    assert [n.name for n in tree.body if isinstance(n, ast.FunctionDef)] == ["program"]
    lines = source.text.splitlines()
    assert len(source.action_lines) == len(PROGRAM)
    lo, hi = source.action_lines[2]
    assert "explore.flush_cache(ctx)" in "\n".join(lines[lo - 1:hi])
    # A start after a pause is guarded: the tokenizer holds requests while paused.
    lo, hi = source.action_lines[4]
    assert lines[lo - 1].strip() == "if explore.can_start(ctx):"
    lo, _ = source.action_lines[0]
    assert "tokenizer_paused" not in lines[lo - 1]
    assert source.action_at(source.action_lines[5][1]) == 5
    assert source.action_at(1) is None


def test_marks_go_on_the_failing_action_or_the_end_checks():
    marked = A.to_source(PROGRAM, mark={1: "FAILS here"}).text.splitlines()
    assert any(l.strip().startswith("yield from ctx.steps(3)") and l.endswith("# <-- FAILS here") for l in marked)
    end = A.to_source(PROGRAM, mark={-1: "FAILS at the end"}).text.splitlines()
    assert end[-1].endswith("# <-- FAILS at the end") and "end_state_checks" in end[-1]


@settings(max_examples=60, deadline=None)
@given(strategies.programs("pp4"))
def test_every_generated_program_compiles(program):
    assert isinstance(program[0], A.Start)
    assert len(program) <= strategies.MAX_ACTIONS
    compile(A.to_source(program).text, "<program>", "exec")
    for action in program:
        if isinstance(action, A.OnWindow):
            assert action.window in strategies.windows_for("pp4")


def test_windows_per_topology():
    assert "pp_inflight_after_last_chunk" in strategies.windows_for("pp4")
    assert "pp_inflight_after_last_chunk" not in strategies.windows_for("pp1-overlap")
    assert "overlap_result_pending" in strategies.windows_for("pp1-overlap")
    assert "overlap_result_pending" not in strategies.windows_for("pp1-normal")
    # HiCache's windows never open without HiCache: drawn only when the engine has it
    assert "hicache_load_in_progress" not in strategies.windows_for("pp1-normal")
    assert "hicache_load_in_progress" in strategies.windows_for("pp1-normal", ("hicache",))


@pytest.mark.parametrize("result, expected", [
    (ScriptResult("s", passed=True), None),
    (ScriptResult("s", passed=False, violation={"invariant": "idle_gate"}, error="x"), "InvariantViolation[idle_gate]"),
    (ScriptResult("s", passed=False, crashed=True,
                  error="SchedulerCrashed: AssertionError: This request holds the node from another tree"),
     "SchedulerCrashed: AssertionError: This request holds the node from another tree"),
    (ScriptResult("s", passed=False, error="EndStateError: requests never finished: 1 of 2 still live after 400 "
                                            "iterations ([r3-99-12:waiting]); state: ..."),
     "EndStateError: requests never finished: N of N still live after N iterations"),
])
def test_failure_signatures_ignore_numbers_and_state(result, expected):
    assert runner.signature_of(result) == expected


def _rec(step, slot, rid, row, it):
    return {"step": step, "it": it, "slot": slot, "batches": {f"mbs[{slot}]": {"mode": "extend", "rids": [rid]}},
            "rows": {rid: row}, "windows": {"w": f"mbs[{slot}]=[{rid}]"},
            "violation": {"invariant": "idle_gate", "iteration": it}}


def test_traces_equal_up_to_rids_rows_slots_and_iterations():
    a = [_rec(1, 4, "r1-100-5", 2048, 700), _rec(2, 5, "r1-100-5", 2048, 701)]
    b = [_rec(1, 1, "r7-200-9", 2040, 900), _rec(2, 2, "r7-200-9", 2040, 901)]
    assert determinism.compare(a, b, slots=6) is None


def test_traces_that_differ_report_the_first_step_and_field():
    a = [_rec(1, 0, "r1-1-1", 5, 1), _rec(2, 1, "r1-1-1", 5, 2)]
    b = [_rec(1, 0, "r1-1-1", 5, 1), _rec(2, 2, "r1-1-1", 5, 2)]
    diff = determinism.compare(a, b, slots=6)
    assert diff is not None and diff.step == 2 and "slot" in diff.fields
    assert diff.culprit == "build" and "nondeterminism in this SGLang build" in diff.describe()
    c = [dict(r, ops=[]) for r in a]
    d = [dict(r, ops=[]) for r in a]
    d[1]["ops"] = [{"op": "flush_cache"}]
    diff = determinism.compare(c, d, slots=6)
    assert diff.step == 2 and diff.fields == ["ops"] and diff.culprit == "harness"
    assert "harness bug" in diff.describe()
    shorter = determinism.compare(a, a[:1], slots=6)
    assert shorter is not None and shorter.step is None and "lengths" in shorter.describe()


def test_stats_add_merge_and_tables():
    out = runner.Outcome(signature=None, steps=10, reset_steps=2, run_s=1.0, reset_s=0.2,
                         io_s=0.1, wall_s=1.1, windows={"w": {"reached": 1, "entered": 1, "open_steps": 2}},
                         coverage={"flush_cache|decode": 2, "abort|idle": 1})
    bad = runner.Outcome(signature="X", steps=3, run_s=0.5, wall_s=0.6)
    a, b = Stats(topology="pp4"), Stats(topology="pp4")
    a.add(out, shrinking=False)
    b.add(bad, shrinking=True)
    a.wall_s, b.wall_s = 60.0, 30.0
    a.merge(b)
    assert (a.examples, a.shrink_examples, a.steps, a.failures) == (2, 1, 13, {"X": 1})
    assert a.per_minute == pytest.approx(2.0)
    table = a.coverage_table()
    assert f"2 of {len(stats_mod.OPS) * 7} combinations exercised; 2 of the " in table
    # at pp4 on CPU: the memory ops' busy phases (6 rows x 4 phases), the CUDA-only compare (7), the
    # tensor and distributed updates ctx refuses under PP (2 rows x 7)
    assert f"2 of the {len(stats_mod.OPS) * 7 - 24 - 7 - 14} that can occur on pp4" in table
    merged = stats_mod.merge_all([Stats(topology="pp4", device="cuda")])
    assert merged.device == "cuda", "a parallel run's merged statistics keep the device"
    assert stats_mod.can_occur("update_weights(tensor)", "idle", "pp4", "cuda")
    assert not stats_mod.can_occur("update_weights(distributed)", "idle", "pp4", "cuda")
    assert stats_mod.can_occur("update_weights(distributed)", "idle", "pp1-normal")
    assert stats_mod.can_occur("check_weights(compare)", "idle", "pp4", "cuda")
    assert not stats_mod.can_occur("check_weights(compare)", "idle", "pp4", "cpu")
    assert not stats_mod.can_occur("release(all)", "decode", "pp4")
    assert stats_mod.can_occur("release(all)", "paused", "pp1-overlap")
    assert not stats_mod.can_occur("flush_cache", "pp_in_flight", "pp1-overlap")
    assert stats_mod.can_occur("flush_cache", "pp_in_flight", "pp4")
    row = next(l for l in table.splitlines() if l.strip().startswith("flush_cache"))
    assert row.split("|")[2].strip() == "2"  # the decode column
    assert "failures: X x1" in a.summary()
    assert Stats.from_dict(a.as_dict()).as_dict() == a.as_dict()
    assert "hicache" not in table  # HiCache's rows and column only where they were seen
    h = Stats(topology="pp1-hicache")
    h.add(runner.Outcome(signature=None, steps=5, coverage={"hicache:hold|idle": 3,
                                                            "flush_cache|hicache_transfer": 1}), shrinking=False)
    lines = h.coverage_table().splitlines()
    assert lines[0].rstrip().endswith("hicache_transfer")
    assert next(l for l in lines if l.strip().startswith("hicache:hold")).split("|")[7].strip() == "3"  # idle
    assert next(l for l in lines if l.strip().startswith("flush_cache")).split("|")[8].strip() == "1"


def test_worker_command_line_round_trips():
    from scripted_runtime.user_side import cli
    from scripted_runtime.user_side.explore import parallel

    args = cli.build_parser().parse_args(["explore", "--pp", "4", "--profile", "ci", "-n", "3", "--seed", "7",
                                          "--revert-fix", "pr27446", "--sglang-arg", "max_total_tokens=4096"])
    argv = parallel.explore_argv(args, workers=1, seed=9, worker_label="w1")
    again = cli.build_parser().parse_args(argv)
    assert (again.pp, again.profile, again.workers, again.seed, again.worker_label) == (4, "ci", 1, 9, "w1")
    assert again.revert_fix == ["pr27446"] and again.sglang_arg == ["max_total_tokens=4096"]


def test_phases_of_a_scheduler_state():
    from tests.logic.test_invariants import FakeBatch, FakeReq, FakeScheduler

    from scripted_runtime.scheduler_side.explore.phases import op_kind, phases_of

    s = FakeScheduler(idle=True)
    s.running_batch = None
    assert phases_of(s) == ["idle"]
    s.running_batch = FakeBatch([])  # what an idle SGLang scheduler holds: an empty running batch
    assert phases_of(s) == ["idle"]
    s = FakeScheduler(reqs=[FakeReq("a", row=1, allocated=4)])
    assert phases_of(s) == ["decode"]
    s.last_batch = FakeBatch([FakeReq("b", row=2, allocated=4)], mode="extend")
    s.waiting_queue = [FakeReq("c")]
    assert phases_of(s, tokenizer_paused=True) == ["prefill_chunk", "decode", "queued", "paused"]
    s = FakeScheduler(reqs=[FakeReq("d", row=1, allocated=4, done=True)])
    assert phases_of(s) == ["finished_unpruned"]
    s = FakeScheduler()
    s.running_batch = None
    s.mbs = [None, FakeBatch([FakeReq("e", row=3, allocated=4)], mode="extend")]
    assert phases_of(s) == ["prefill_chunk", "pp_in_flight"]
    assert op_kind("update_weights_from_disk", {"flush_cache": False}) == "update_weights(no_flush)"
    assert op_kind("pause_generation(retract)", None) == "pause(retract)"
    assert op_kind("abort(r3-1-2)", None) == "abort"
    assert op_kind("load_lora_adapter('lora1')", None) == "lora:load"
    assert op_kind("load_lora_adapter_from_tensors('lora1')", None) == "lora:load_tensors"


class _FakeRunner:
    """Runs nothing: records the programs, fails the ones ``fails`` picks."""

    def __init__(self, topology, fails=lambda program: False):
        self.topology, self.fails, self.ran, self.restarts = topology, fails, [], 0
        self.info = {"sglang_version": "0.0.test"}

    def run(self, program, trace=None):
        self.ran.append(list(program))
        return runner.Outcome(signature="InvariantViolation[slot_ownership]" if self.fails(program) else None,
                              message="planted", steps=len(program))


@pytest.mark.parametrize("topology", ["pp1-overlap", "pp1-normal", "pp4"])
def test_seed_corpus_is_every_operation_in_every_phase_and_compiles(topology):
    from scripted_runtime.user_side.explore import corpus

    programs = corpus.programs(topology)
    assert len(programs) == len(corpus.phases(topology)) * len(corpus.OPERATIONS)
    assert len({tuple(p) for _, p in programs}) == len(programs)
    for name, program in programs:
        assert isinstance(program[0], A.Start), name
        compile(A.to_source(program).text, name, "exec")
        pauses = [a for a in program if isinstance(a, A.Pause)]
        continues = [a for a in program if isinstance(a, A.Continue)]
        assert len(pauses) == len(continues), f"{name}: a pause without its continue"
    ops = {type(a) for _, p in programs for a in p}
    assert {A.Flush, A.UpdateWeights, A.AbortOne, A.AbortAll, A.Pause, A.Continue} <= ops


def test_seed_corpus_joins_a_decoding_micro_batch_under_pp_and_scales_its_waits():
    """Under PP a request joins the micro-batch of a decoding one only when
    started beside it, so pp4's corpus has that phase (pp=1's has not, where
    every request joins the one running batch); its profile wait is as many
    micro-batch rounds as pp=1's is iterations; the two short requests under
    KV pressure are in every topology's corpus."""
    from scripted_runtime.user_side.explore import corpus

    assert "joined_decoding" in corpus.phases("pp4") and "joined_decoding" not in corpus.phases("pp1-normal")
    joined = corpus.phases("pp4")["joined_decoding"]
    assert [a.beside for a in joined if isinstance(a, A.Start)] == [None, 0]
    waits = {t: [a.n for a in corpus.operations(t)["knobs_and_queries"] if isinstance(a, A.Steps)]
             for t in ("pp1-overlap", "pp4")}
    assert waits == {"pp1-overlap": [8], "pp4": [24]}
    assert corpus.operations("pp1-normal") is corpus.OPERATIONS
    for topology in ("pp1-overlap", "pp1-normal", "pp4"):
        names = [name for name, _ in corpus.programs(topology)]
        assert "finished+kv_pressure_two_arrive" in names


def test_search_runs_the_corpus_first_outside_the_time_budget_then_generates():
    from scripted_runtime.user_side.explore import corpus, search

    fake = _FakeRunner("pp1-normal")
    result = search.search(fake, ExploreSettings(profile="ci", max_examples=5, max_time_s=0.0, known_bugs=()))
    seeds = [p for _, p in corpus.programs("pp1-normal")]
    # no time budget at all: the corpus still ran, in its order, and nothing generated ran
    assert fake.ran == seeds and result.program is None
    fake = _FakeRunner("pp1-normal")
    search.search(fake, ExploreSettings(profile="ci", max_examples=5, max_time_s=60.0, known_bugs=()))
    assert fake.ran[:len(seeds)] == seeds and len(fake.ran) > len(seeds)
    fake = _FakeRunner("pp1-normal")
    search.search(fake, ExploreSettings(profile="ci", max_examples=5, corpus=False, known_bugs=()))
    assert fake.ran[0] not in seeds


def _runner_on_a_fake_clock(monkeypatch, search):
    """A _FakeRunner class whose every program run advances the search's
    clock (patched into ``search``) by 1 s."""
    now = [1000.0]

    class _Timed(_FakeRunner):
        def run(self, program, trace=None):
            now[0] += 1.0
            return super().run(program, trace)

    monkeypatch.setattr(search, "time", SimpleNamespace(monotonic=lambda: now[0]))
    return _Timed


def test_the_search_time_budget_starts_after_the_corpus(monkeypatch):
    """The corpus runs outside the time budget however long it takes (at
    pp=4 it alone is ~70 s, longer than the ci profile's 60 s): the
    generated programs still get the whole budget. A fake clock advances 1 s
    a program run."""
    from scripted_runtime.user_side.explore import corpus, search

    _Timed = _runner_on_a_fake_clock(monkeypatch, search)
    fake = _Timed("pp4")
    search.search(fake, ExploreSettings(profile="ci", max_examples=1000, max_time_s=30.0, known_bugs=()))
    seeds = [p for _, p in corpus.programs("pp4")]
    assert len(seeds) > 30 and fake.ran[:len(seeds)] == seeds
    assert 29 <= len(fake.ran) - len(seeds) <= 31, len(fake.ran) - len(seeds)


@pytest.mark.parametrize("topology, seconds", [("pp1-overlap", 60), ("pp1-normal", 60), ("pp4", 180)])
def test_the_ci_search_at_pp4_runs_three_times_as_long(monkeypatch, topology, seconds):
    """The ci profile's 60 s is pp=1's; pp4, whose programs take ~5x the
    iterations, gets 180 s (``search.CI_TIME_SCALE``), and a --max-time the
    user gives is taken as it is on every topology. A fake clock advances
    1 s a program run, the corpus left out."""
    from scripted_runtime.user_side.explore import search

    _Timed = _runner_on_a_fake_clock(monkeypatch, search)
    fake = _Timed(topology)
    search.search(fake, ExploreSettings(profile="ci", corpus=False, known_bugs=()))
    assert seconds - 1 <= len(fake.ran) <= seconds + 1, len(fake.ran)
    given = _Timed(topology)
    search.search(given, ExploreSettings(profile="ci", corpus=False, max_time_s=20.0, known_bugs=()))
    assert 19 <= len(given.ran) <= 21, len(given.ran)
    assert search.PROFILES["dev"].search_time_s("pp4") == search.PROFILES["dev"].max_time_s


def test_a_failing_corpus_program_is_the_reported_failure():
    from scripted_runtime.user_side.explore import corpus, search

    target = dict(corpus.programs("pp4"))["decoding+abort_one"]
    fake = _FakeRunner("pp4", fails=lambda program: program == target)
    result = search.search(fake, ExploreSettings(profile="ci", max_examples=5, known_bugs=()))
    assert result.program == target and result.outcome.signature == "InvariantViolation[slot_ownership]"
    assert result.found_after_examples == [p for _, p in corpus.programs("pp4")].index(target) + 1


class _FakeServer:
    """launch() blocks until abandoned (or ``fail``s); records shutdown."""

    def __init__(self, fail=None, launch_s=None):
        import threading

        self.fail, self.launch_s, self.shut = fail, launch_s, False
        self._abandon = threading.Event()

    def sibling(self):
        return _FakeServer(self.fail, self.launch_s)

    def launch(self):
        if self.fail:
            raise self.fail
        if self._abandon.wait(self.launch_s):
            raise RuntimeError("abandoned")
        return self

    def abandon(self):
        self._abandon.set()

    def shutdown(self):
        self.shut = True


def test_standby_is_ready_then_taken_and_a_failed_or_slow_one_is_stopped():
    import time

    from scripted_runtime.user_side.standby import Standby

    prepared = []
    ready = Standby(_FakeServer(launch_s=0.01), prepare=prepared.append)
    assert ready.take(timeout_s=5) is ready.server and prepared == [ready.server] and ready.ready
    failed = Standby(_FakeServer(fail=RuntimeError("no port")))
    assert failed.take(timeout_s=5) is None and failed.server.shut
    slow = Standby(_FakeServer(launch_s=60))
    t0 = time.monotonic()
    assert slow.take(timeout_s=0.2) is None  # not ready in time: abandoned, nothing left
    assert slow.server.shut and time.monotonic() - t0 < 5
    starting = Standby(_FakeServer(launch_s=60))
    t0 = time.monotonic()
    starting.close()  # mid-start
    assert starting.server.shut and time.monotonic() - t0 < 5


def test_runner_refuses_an_unknown_standby_mode_and_never_stands_by_for_a_server_it_does_not_own():
    assert runner.ExampleRunner(ServerConfig("pp1-normal"), server=object(), standby="on").standby_mode == "off"
    with pytest.raises(ValueError, match="standby must be one of auto, on, off"):
        runner.ExampleRunner(ServerConfig("pp1-normal"), standby="always")


def test_auto_stands_by_only_where_a_restart_spawns_a_server(monkeypatch):
    """A server forked from a template restarts in seconds: no second server."""
    monkeypatch.delenv("SCRIPTED_RUNTIME_TEMPLATES", raising=False)
    assert runner.ExampleRunner(ServerConfig("pp4"), standby="auto").standby_mode == "off"
    assert runner.ExampleRunner(ServerConfig("pp4"), standby="on").standby_mode == "on"
    monkeypatch.setenv("SCRIPTED_RUNTIME_TEMPLATES", "off")
    assert runner.ExampleRunner(ServerConfig("pp4"), standby="auto").standby_mode == "auto"


def test_a_program_that_leaves_an_engine_the_reset_cannot_restore_is_the_failing_one():
    """The reset is run right after a passing program; if it dies there, the
    failure is that program's (else the next program would be blamed and then
    pass on a fresh server: the failure lost)."""
    from scripted_runtime.user_side.result import ScriptResult

    class Server:
        alive, info = True, {"sglang_version": "0.0.test"}

        def __init__(self, settle_crashes):
            self.settle_crashes, self.targets = settle_crashes, []

        def run(self, target, *args, **kwargs):
            self.targets.append(target)
            if target == runner.SETTLE and self.settle_crashes:
                return ScriptResult(script="nothing", passed=False, crashed=True, crashed_in_reset=True,
                                    error="SchedulerCrashed: AssertionError: freed twice", traceback="tb")
            return ScriptResult(script="program", passed=True, steps=7)

    clean = Server(settle_crashes=False)
    out = runner.ExampleRunner(ServerConfig("pp1-normal", checks=False), server=clean).run([A.Start(8, 1, 2)])
    assert out.signature is None and clean.targets == [runner.INTERPRETER, runner.SETTLE]
    broken = Server(settle_crashes=True)
    out = runner.ExampleRunner(ServerConfig("pp1-normal", checks=False), server=broken).run([A.Start(8, 1, 2)])
    assert out.signature == "SchedulerCrashed: AssertionError: freed twice" and out.steps == 7
    assert out.failing_action is None  # after the program's last action: the end


def test_a_failed_program_that_leaves_an_engine_the_reset_crashes_on_is_judged_by_the_crash():
    """After a failure that left the scheduler alive (a registered bug's
    symptom, say) the reset is probed too: a crash there is that program's
    failure, judged with its operations and the reset's that met the crash
    (the driver's crash report in a reset carries both; else the next program
    would be retried on a fresh server and the crash counted nowhere); a
    probe that passes, or a program that crashed itself, keeps the program's
    own failure."""
    from scripted_runtime.user_side.result import ScriptResult

    violation = {"invariant": "pause_holds", "kind": "ContractViolation", "step": 4}
    # what the driver's crash report in a reset carries: the program's unsettled operations (the
    # settled ones are dropped before the reset), then the reset's
    reset_log = [{"op": "continue_generation"}, {"op": "abort_all"}]

    class Server:
        alive, info = True, {"sglang_version": "0.0.test"}

        def __init__(self, settle_crashes, program_crashes=False, reset_log_known=True):
            self.settle_crashes, self.program_crashes, self.targets = settle_crashes, program_crashes, []
            self.reset_log_known = reset_log_known

        def run(self, target, *args, **kwargs):
            self.targets.append(target)
            if target == runner.SETTLE:
                if self.settle_crashes:
                    return ScriptResult(script="nothing", passed=False, crashed=True, crashed_in_reset=True,
                                        error="SchedulerCrashed: AssertionError: freed twice", traceback="tb",
                                        control_log=reset_log if self.reset_log_known else [],
                                        control_log_known=self.reset_log_known)
                return ScriptResult(script="nothing", passed=True)
            if self.program_crashes:
                self.alive = False
                return ScriptResult(script="program", passed=False, crashed=True, steps=3,
                                    error="SchedulerCrashed: ValueError: bad row",
                                    control_log=[{"op": "flush_cache"}])
            return ScriptResult(script="program", passed=False, steps=5, violation=violation,
                                error="ContractViolation: pause_holds", traceback="program tb",
                                control_log=[{"op": "pause_generation(in_place)"}])

    config = ServerConfig("pp1-normal", checks=False)
    broken = Server(settle_crashes=True)
    out = runner.ExampleRunner(config, server=broken).run([A.Start(8, 1, 2)])
    assert out.signature == "SchedulerCrashed: AssertionError: freed twice"
    assert out.ops == ("pause_generation(in_place)", "continue_generation", "abort_all")
    assert broken.targets[:2] == [runner.INTERPRETER, runner.SETTLE]
    silent = Server(settle_crashes=True, reset_log_known=False)  # a crash report without a log: the program's
    assert runner.ExampleRunner(config, server=silent).run([A.Start(8, 1, 2)]).ops == ("pause_generation(in_place)",)
    sound = Server(settle_crashes=False)
    out = runner.ExampleRunner(config, server=sound).run([A.Start(8, 1, 2)])
    assert out.signature == "ContractViolation[pause_holds]" and sound.targets[:2] == [runner.INTERPRETER, runner.SETTLE]
    crashed = Server(settle_crashes=True, program_crashes=True)
    out = runner.ExampleRunner(config, server=crashed).run([A.Start(8, 1, 2)])
    assert out.signature == "SchedulerCrashed: ValueError: bad row" and runner.SETTLE not in crashed.targets


def test_a_hicache_program_can_open_with_three_distinct_prefixes():
    from hypothesis import find

    program = find(strategies.programs("pp1-hicache"),
                   lambda p: [a.family for a in p if isinstance(a, A.Start)][:3] == [0, 1, 2])
    assert [a.family for a in program if isinstance(a, A.Start)] == [0, 1, 2]  # shrunk to just the opening


def test_hicache_gate_actions_are_drawn_only_with_hicache_on():
    from hypothesis import find

    from scripted_runtime.user_side import engine_config
    from scripted_runtime.user_side.explore import corpus

    assert engine_config.features_of("pp1-hicache") == ("hicache",)
    assert engine_config.features_of("pp1-normal", {"enable_hierarchical_cache": "true"}) == ("hicache",)
    assert engine_config.features_of("pp1-normal") == ()
    assert "hicache_load_in_progress" in strategies.windows_for("pp1-hicache")
    hold = find(strategies.action_strategy("pp1-hicache"), lambda a: isinstance(a, A.HoldTransfers))
    assert hold.loads or hold.backups
    with pytest.raises(Exception):  # never drawn without HiCache
        find(strategies.action_strategy("pp1-normal"), lambda a: isinstance(a, (A.HoldTransfers, A.ReleaseTransfers)),
             settings=settings(max_examples=300, database=None))
    source = A.to_source([A.Start(150, 1, 2), A.HoldTransfers(loads=True, backups=False), A.ReleaseTransfers()]).text
    assert "explore.hold_transfers(ctx, loads=True, backups=False)" in source
    assert "explore.release_transfers(ctx)" in source
    compile(source, "<program>", "exec")
    # the corpus adds HiCache's phases only with the feature on
    with_hicache = dict(corpus.programs("pp1-hicache", ("hicache",)))
    assert "load_held+flush" in with_hicache and "backup_held+abort_all" in with_hicache
    assert not any(k.startswith(("load_held", "backup_held")) for k in dict(corpus.programs("pp1-normal")))
    # the written file's replay command starts the same engine
    assert engine_config.run_options("pp1-hicache") == (
        " --no-overlap --sglang-arg enable_hierarchical_cache=true --sglang-arg hicache_write_policy=write_through"
        " --sglang-arg max_total_tokens=400 --sglang-arg hicache_ratio=1.2")
    # a list value survives the shell and parse_engine_args
    import shlex

    argv = shlex.split(engine_config.run_options("pp1-lora"))
    values = [argv[i + 1] for i, a in enumerate(argv) if a == "--sglang-arg"]
    assert engine_config.parse_engine_args(values) == engine_config.ALL_TOPOLOGIES["pp1-lora"]


@settings(max_examples=40, deadline=None)
@given(strategies.programs("pp1-hicache"))
def test_every_generated_hicache_program_compiles_and_may_hold_from_its_start(program):
    first_start = next(i for i, a in enumerate(program) if isinstance(a, A.Start))
    assert first_start <= 1 and (first_start == 0 or isinstance(program[0], A.HoldTransfers))
    # it opens with up to three prompts of distinct prefixes (families 0, 1, 2 in turn)
    assert program[first_start].family == strategies.PROMPT_FAMILIES[0]
    assert program[first_start].prompt_len in strategies.HICACHE_PROMPT_LENGTHS
    assert len(program) <= strategies.MAX_ACTIONS
    compile(A.to_source(program).text, "<program>", "exec")


def test_the_search_returns_every_failure_met_and_tells_its_events_in_order():
    """``SearchResult.failures``: each signature met, its first program as
    found and where; ``SearchEvents``: ``met`` (kept at once), then on the
    first new failure ``found`` and ``alone``, before any shrinking."""
    from scripted_runtime.user_side.explore import corpus, search

    target = dict(corpus.programs("pp4"))["decoding+abort_one"]
    told = []

    class Events(search.SearchEvents):
        def met(self, finding):
            told.append(("met", finding.signature, finding.position, list(finding.program)))
            return f"kept/{finding.position}.py"

        def found(self, finding):
            told.append(("found", finding.signature, finding.position, list(finding.program)))

        def alone(self, finding):
            told.append(("alone", finding.signature, finding.position, list(finding.program)))
            return None

    fake = _FakeRunner("pp4", fails=lambda program: program == target)
    result = search.search(fake, ExploreSettings(profile="ci", max_examples=5, known_bugs=()), events=Events())
    position = [p for _, p in corpus.programs("pp4")].index(target) + 1
    signature = "InvariantViolation[slot_ownership]"
    assert told == [(what, signature, position, target) for what in ("met", "found", "alone")]
    [finding] = result.failures
    assert (finding.signature, finding.program, finding.position, finding.known, finding.kept) == (
        signature, target, position, "", f"kept/{position}.py")
    assert result.kept == {signature: f"kept/{position}.py"} and not result.needs_history


def test_a_failure_that_passes_alone_is_not_shrunk():
    from scripted_runtime.user_side.explore import corpus, search

    class Events(search.SearchEvents):
        def alone(self, finding):
            return False

    programs = [p for _, p in corpus.programs("pp1-normal")]
    fake = _FakeRunner("pp1-normal", fails=lambda program: program == programs[2])
    result = search.search(fake, ExploreSettings(profile="ci", max_examples=5, known_bugs=()), events=Events())
    assert result.needs_history and result.first_program == programs[2] and fake.ran == programs[:3]


def test_a_failure_whose_keeping_failed_is_offered_again_with_its_next_program():
    from scripted_runtime.user_side.explore import search

    offered = []

    class Events(search.SearchEvents):
        def met(self, finding):
            offered.append(finding.position)
            if len(offered) == 1:
                raise OSError("disk full")  # reported; the search goes on
            return "kept.py"

    # A program with a flush and more than the minimum fails: its shrinking meets a second failing
    # program whatever the first was (a minimal first one would have nothing to shrink to).
    fake = _FakeRunner("pp1-normal", fails=lambda program: any(isinstance(a, A.Flush) for a in program)
                       and len(program) >= 3)
    lines = []
    # (400 programs: the grammar draws a flush among a dozen control operations; grammar 18's
    # derandomized draw meets the first failing one at program 223)
    result = search.search(fake, ExploreSettings(profile="ci", max_examples=400, corpus=False, shrink_time_s=5,
                                                 known_bugs=()), events=Events(), progress=lines.append)
    assert any("could NOT keep" in line and "disk full" in line for line in lines)
    assert len(offered) == 2 and offered[0] < offered[1]
    [finding] = result.failures
    assert (finding.position, finding.kept) == (offered[0], "kept.py")


def test_explore_takes_one_config_one_settings_value_and_at_most_six_parameters():
    import inspect

    from scripted_runtime.user_side.explore import explorer

    params = inspect.signature(explorer.explore).parameters
    assert len(params) <= 6, list(params)
    assert list(params)[:2] == ["config", "settings"]


def test_a_reset_that_fails_after_a_failed_program_restarts_an_owned_server_at_once():
    """A wedged engine (an abort pause that never answers) fails every later
    reset the same way: the runner restarts the server it owns right away,
    keeping the program's own failure."""
    from scripted_runtime.user_side.result import ScriptResult

    class Server:
        alive, info = True, {"sglang_version": "0.0.test"}

        def run(self, target, *args, **kwargs):
            if target == runner.SETTLE:
                return ScriptResult(script="nothing", passed=False, error="ResetError: a pause_generation(abort) ...")
            return ScriptResult(script="program", passed=False, steps=5, error="PauseAnswerTimeout: pause_generation(abort)")

    r = runner.ExampleRunner(ServerConfig("pp1-normal", checks=False), server=Server())
    restarts = []
    r._restart = restarts.append
    out = r.run([A.Start(8, 1, 2)])
    assert out.signature.startswith("PauseAnswerTimeout") and restarts == [], "a server it does not own is left"
    r._own_server = True
    out = r.run([A.Start(8, 1, 2)])
    assert out.signature.startswith("PauseAnswerTimeout") and len(restarts) == 1 and "reset" in restarts[0]


def test_memory_operations_have_their_coverage_rows():
    from scripted_runtime.scheduler_side.explore import phases

    kind = lambda name: phases.op_kind(name, {})
    assert kind("release_memory_occupation(kv_cache,weights,cuda_graph)") == "release(all)"
    assert kind("release_memory_occupation(weights)") == "release(weights)"
    assert kind("resume_memory_occupation(cuda_graph,kv_cache)") == "resume(kv_cache)"  # graphs: nothing on CPU
    assert kind("pause_generation(abort)") == "pause(abort)"
    rows = {kind(n) for n in ("release_memory_occupation(kv_cache)", "resume_memory_occupation(weights)",
                              "resume_memory_occupation(kv_cache,weights)")}
    assert rows <= set(stats_mod.OPS)


def test_a_failure_met_while_shrinking_the_first_is_kept_not_shrunk_in_its_place():
    """The search shrinks the failure it found. Another one met while
    shrinking it is kept as found (its first program, with its position)
    but not raised: raised, Hypothesis would report whichever is smaller
    by its own order, and the written file and its history replay would not
    be the failure found. Measured before: two pp1-normal no-corpus kills
    (mut_merge_batch_rows_other_first, mut_admission_drops_next_waiting)
    were written as a failure first met while shrinking, and their history
    replays ran the programs before the other one: NOT reproduced."""
    from scripted_runtime.user_side.explore import search

    class _TwoBugs(_FakeRunner):
        def run(self, program, trace=None):
            self.ran.append(list(program))
            small = len(program) == 2 and isinstance(program[1], A.Steps)  # what shrinking tries first
            signature = ("InvariantViolation[slot_ownership]" if small else
                         "EndStateError: big" if len(program) >= 2 else None)
            return runner.Outcome(signature=signature, message="planted", steps=len(program))

    lines = []
    fake = _TwoBugs("pp1-normal")
    result = search.search(fake, ExploreSettings(profile="ci", max_examples=200, corpus=False, known_bugs=()),
                           progress=lines.append)
    first_big = next(i for i, p in enumerate(fake.ran) if len(p) >= 2)
    first_small = next(i for i, p in enumerate(fake.ran) if len(p) == 2 and isinstance(p[1], A.Steps))
    assert first_big < first_small, "the search met the big one first, then the small one while shrinking it"
    assert result.outcome.signature == "EndStateError: big" and len(result.program) >= 2
    assert result.first_program == fake.ran[first_big] and result.found_after_examples == first_big + 1
    kept = {f.signature: f for f in result.failures}
    assert kept["InvariantViolation[slot_ownership]"].position == first_small + 1
    assert any("shrinking met another failure, InvariantViolation[slot_ownership]: kept as found" in line
               for line in lines), lines


def test_the_served_weights_are_loaded_back_after_a_failed_program_or_file(tmp_path):
    """A failure can stop a program between its weight update and its own
    restore of the served weights; the runner restores them before anything
    else runs, after a program and after a written file alike (the
    determinism check runs the program right after its file's replay: it
    must start as on a fresh server, not with the restore's steps)."""
    from scripted_runtime.user_side.result import ScriptResult

    class Server:
        alive, info = True, {"sglang_version": "0.0.test"}

        def __init__(self, fails):
            self.fails, self.targets = fails, []

        def run(self, target, *args, **kwargs):
            self.targets.append(target)
            if target in (runner.SETTLE, runner.RESTORE_WEIGHTS) or not self.fails:
                return ScriptResult(script="x", passed=True, steps=3)
            return ScriptResult(script="program", passed=False, steps=5, error="ContractViolation: weight_queries",
                                violation={"invariant": "weight_queries", "kind": "ContractViolation", "step": 4})

    scenario = tmp_path / "found.py"
    scenario.write_text("def program(ctx):\n    return None\n    yield\n")
    for fails in (True, False):
        server = Server(fails)
        example = runner.ExampleRunner(ServerConfig("pp1-normal"), server=server)  # every check: the oracle on
        example.run_file(str(scenario))
        example.run([A.Start(8, 1, 2)])
        restores = [i for i, t in enumerate(server.targets) if t == runner.RESTORE_WEIGHTS]
        if fails:  # right after the file, and after the program
            assert len(restores) == 2 and server.targets[restores[0] - 1] != runner.INTERPRETER, server.targets
            assert server.targets[restores[0] + 1] == runner.INTERPRETER, server.targets
        else:
            assert not restores, server.targets
    # with the oracle off nothing is restored (no references, no served fingerprint kept)
    server = Server(True)
    runner.ExampleRunner(ServerConfig("pp1-normal", checks=False), server=server).run_file(str(scenario))
    assert runner.RESTORE_WEIGHTS not in server.targets


def test_the_report_names_a_custom_registry_s_bugs_with_their_own_reports():
    """A search run with a registry of its own (``ExploreSettings.known_bugs``)
    may meet and waive bugs the built-in registry does not hold: the printed
    report reads their upstream reports from the report itself (it raised
    KeyError looking them up in the built-in registry)."""
    from scripted_runtime.user_side.explore import explorer
    from scripted_runtime.user_side.explore.explorer import ExploreReport

    report = ExploreReport(stats=Stats(topology="pp1-normal"),
                           known={"team_bug": {"signature": "InvariantViolation[x]", "after_programs": 3,
                                               "scenario": "kept/x.py"}},
                           waived={"pause": "team_waived_bug"},
                           reports={"team_bug": "https://example.org/issues/1",
                                    "team_waived_bug": "docs/upstream/team.md"})
    lines = []
    explorer.print_report(report, profile="ci", out=lines.append)
    text = "\n".join(lines)
    assert ("known: team_bug: InvariantViolation[x] (first after 3 programs; reported upstream: "
            "https://example.org/issues/1; program: kept/x.py)") in text
    assert "waived: team_waived_bug: the 'pause' check was off" in text and "docs/upstream/team.md" in text
