"""Workarounds of registered bugs (hooks/workarounds.py): which servers an
exploration starts with one, and what the PP profiler fence does, on a fake
scheduler class (its run on a real pp4 server, where it keeps the profiler
stress scenario alive, is tests/server/test_workarounds.py, slow lane)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from scripted_runtime import known_bugs
from scripted_runtime.hooks import patches, workarounds
from scripted_runtime.hooks.patch_base import PatchError
from scripted_runtime.user_side.explore import explorer
from scripted_runtime.user_side.explore.explore_settings import ExploreSettings
from scripted_runtime.user_side.server_config import ServerConfig

FENCE = "fence_pp_profiler_stop"


def test_the_profiler_bug_names_a_builtin_workaround_for_pp_on_its_releases():
    bug = known_bugs.by_name("pp_profiler_stop_with_sends_in_flight")
    assert bug.workaround == FENCE and FENCE in patches.builtin_names()
    assert patches.check(FENCE).spec == FENCE
    assert known_bugs.workarounds(known_bugs.REGISTRY, topology="pp4", sglang_version="0.5.23") == {
        FENCE: bug.name}
    for topology, version in (("pp1-overlap", "0.5.23"), ("pp1-normal", "0.5.23"), ("pp4", "0.5.24"),
                              ("pp4", None)):
        assert known_bugs.workarounds(known_bugs.REGISTRY, topology=topology, sglang_version=version) == {}, (
            topology, version)


def test_an_exploration_adds_the_workaround_after_its_own_patches_unless_told_not_to():
    config = ServerConfig(topology="pp4", patches=("mut_abort_keeps_row",))
    got, added = explorer.work_around_known(config, ExploreSettings(), "0.5.23")
    assert got.patches == ("mut_abort_keeps_row", FENCE) and added == {FENCE: "pp_profiler_stop_with_sends_in_flight"}
    assert f"--patch {FENCE}" in got.as_cli_args()  # a written file's replay starts the same server
    assert got.key() != config.key()  # a server of its own in the pool, its own reference-cache key
    assert explorer.work_around_known(config, ExploreSettings(waive_known=False), "0.5.23") == (config, {})
    assert explorer.work_around_known(config.replace(topology="pp1-normal"), ExploreSettings(), "0.5.23")[1] == {}
    assert explorer.work_around_known(got, ExploreSettings(), "0.5.23") == (got, {})  # asked for by hand already
    assert explorer.work_around_known(config, ExploreSettings(known_bugs=()), "0.5.23") == (config, {})


class _FakeManager:
    def __init__(self, log):
        self.log = log

    def _stop_profile(self, stage=None):
        self.log.append(("stop", stage))
        return "stopped"


def _fake_scheduler_module(log, *, world_size, loop_started=True):
    class Scheduler:
        def init_profiler(self):
            self.profiler_manager = _FakeManager(log)

        def _pp_commit_comm_work(self, work):
            log.append(("commit", tuple(work)))
            work.clear()

        def _pp_commit_proxy_send_work(self):
            log.append(("commit proxy", tuple(self.send_proxy_work)))
            self.send_proxy_work.clear()

    scheduler = Scheduler()
    scheduler.pp_group = SimpleNamespace(world_size=world_size)
    if loop_started:
        scheduler.send_req_work, scheduler.send_proxy_work, scheduler.send_output_work = ["req"], ["proxy"], ["out"]
    return SimpleNamespace(Scheduler=Scheduler), scheduler


def test_the_fence_waits_every_send_in_flight_before_the_profiler_stops_under_pp_only():
    log = []
    module, scheduler = _fake_scheduler_module(log, world_size=4)
    workarounds.WORKAROUNDS[FENCE].install(module)
    scheduler.init_profiler()
    assert scheduler.profiler_manager._stop_profile("all") == "stopped"
    assert log == [("commit", ("req",)), ("commit proxy", ("proxy",)), ("commit", ("out",)), ("stop", "all")]
    log.clear()
    scheduler.profiler_manager._stop_profile()  # the loop's own commit later finds nothing left to wait
    assert log == [("commit", ()), ("commit proxy", ()), ("commit", ()), ("stop", None)]
    for world_size, started in ((1, True), (4, False)):  # no PP, or the PP loop not begun: the stop alone
        log = []
        module, scheduler = _fake_scheduler_module(log, world_size=world_size, loop_started=started)
        workarounds.WORKAROUNDS[FENCE].install(module)
        scheduler.init_profiler()
        scheduler.profiler_manager._stop_profile()
        assert log == [("stop", None)], (world_size, started)


def test_the_fence_refuses_a_release_without_the_pp_send_commits():
    with pytest.raises(PatchError, match="_pp_commit_comm_work"):
        workarounds.WORKAROUNDS[FENCE].install(SimpleNamespace(Scheduler=type("Scheduler", (), {
            "init_profiler": lambda self: None})))
