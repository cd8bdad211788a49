"""Workarounds: candidate fixes of registered SGLang bugs, as built-in
patches an exploration applies so that a known bug it keeps meeting does
not end the programs that could show a new one.

A workaround is named by its registry entry (``known_bugs.KnownBug.workaround``).
``explore`` and ``mutate`` add it to the servers they start where that
entry applies to the topology and the installed release, and say so in
their output (``--no-waive-known`` leaves it out); the entry's strict xfail
runs without it, so the bug stays checked. A written file's replay command
names the patch, so a replay starts the same server the search ran on.

Each is a ``Patch`` (``--patch NAME`` asks for it by hand too) that changes
only the order of work the bug is about, never what a request computes:
the output oracle's references are the same with it or without it.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List

from scripted_runtime.hooks.patch_base import Patch, PatchError, declaring

WORKAROUNDS: Dict[str, Patch] = {}


def without_workarounds(patches: Iterable[str]) -> List[str]:
    """``patches`` as they identify a build: the workarounds left out (they
    change no output, so the failure database and the reference cache key
    a build the same with them or without them)."""
    return [p for p in patches if p not in WORKAROUNDS]


def workaround(name: str, *, summary: str, topologies: tuple) -> Callable:
    """Declare the decorated ``install(scheduler_module)`` as workaround ``name``."""
    return declaring(WORKAROUNDS, lambda install: Patch(name, summary, install, topologies=topologies))


@workaround("fence_pp_profiler_stop", topologies=("pp4",),
            summary="wait the PP loop's in-flight sends before the torch profiler stops "
                    "(works around pp_profiler_stop_with_sends_in_flight)")
def _fence_pp_profiler_stop(scheduler_module: Any) -> None:
    """Before the torch profiler stops (its ``num_steps`` reached, or
    ``/stop_profile``), the PP loop's asynchronous point-to-point sends still
    in flight (``send_req_work``, ``send_proxy_work``, ``send_output_work``)
    are waited for, so no gloo ``AsyncWork`` ends its profiling record while
    the profiler is torn down (docs/upstream/pp-profiler-stop-with-sends-in-flight.md).
    ``_pp_commit_comm_work`` empties the list it waited on, so the loop's own
    commit later finds nothing to wait for (a second ``wait()`` on a
    completed gloo work does not return). Without PP it does nothing."""
    scheduler_cls = scheduler_module.Scheduler
    needed = ("init_profiler", "_pp_commit_comm_work", "_pp_commit_proxy_send_work")
    missing = [name for name in needed if not hasattr(scheduler_cls, name)]
    if missing:
        raise PatchError(f"workaround fence_pp_profiler_stop: Scheduler.{', '.join(missing)} not found in this "
                         "release; the PP loop's sends or its profiler moved")
    original_init_profiler = scheduler_cls.init_profiler

    def init_profiler(self: Any) -> None:
        original_init_profiler(self)
        manager = self.profiler_manager
        original_stop = manager._stop_profile

        def _stop_profile(*args: Any, **kwargs: Any) -> Any:
            pp = getattr(self, "pp_group", None)
            if pp is not None and pp.world_size > 1 and hasattr(self, "send_req_work"):  # the PP loop has begun
                self._pp_commit_comm_work(self.send_req_work)
                self._pp_commit_proxy_send_work()  # as the loop does: it keeps the CUDA-graph forward fence
                self._pp_commit_comm_work(self.send_output_work)
            return original_stop(*args, **kwargs)

        manager._stop_profile = _stop_profile

    scheduler_cls.init_profiler = init_profiler
