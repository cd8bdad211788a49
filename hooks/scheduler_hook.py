"""Wraps SGLang's ``Scheduler`` so the harness drives it one iteration at a time.

Installed when ``sglang.srt.managers.scheduler`` is imported in a scheduler
rank. Three wrappers, none of which depends on SGLang's built-in
scripted-runtime hook points (older releases have none):

* the iteration entry (``ingest_requests``, or ``recv_requests`` before it
  existed): on the driver rank, hands control to the script driver *before*
  the scheduler reads its input, so whatever a script sends in step k is
  ingested in iteration k. Other ranks stay in lock-step because they wait in
  the cross-rank broadcast of the received requests.
* ``run_batch``: records every forward launched (driver rank).
* the event loops: an exception that kills a rank is written to the crash
  directory (and sent to the harness from the driver) before it propagates.
"""
from __future__ import annotations

import functools
import os
import time
import traceback

from hooks import sglang_compat
from scripted_runtime import protocol

_DRIVER_ATTR = "_scripted_runtime_driver"


def _driver_for(scheduler):
    driver = scheduler.__dict__.get(_DRIVER_ATTR)
    if driver is None:
        pp_rank, tp_rank, _, _ = sglang_compat.rank_info(scheduler)
        if pp_rank == 0 and tp_rank == 0:
            from scripted_runtime.driver import Driver

            driver = Driver(scheduler)
        else:
            driver = False
        scheduler.__dict__[_DRIVER_ATTR] = driver
    return driver or None


def _write_crash_file(scheduler, tb: str) -> None:
    crash_dir = os.environ.get(protocol.ENV_CRASH_DIR)
    if not crash_dir:
        return
    pp_rank, tp_rank, _, _ = sglang_compat.rank_info(scheduler)
    path = os.path.join(crash_dir, f"crash-pp{pp_rank}-tp{tp_rank}-{os.getpid()}.txt")
    try:
        with open(path, "w") as f:
            f.write(f"{time.time()}\n{tb}")
    except OSError:
        pass


def install(scheduler_module) -> None:
    scheduler_cls = scheduler_module.Scheduler
    if getattr(scheduler_cls, "_scripted_runtime_installed", False):
        return
    scheduler_cls._scripted_runtime_installed = True

    entry_name = sglang_compat.iteration_entry_name(scheduler_cls)
    original_entry = getattr(scheduler_cls, entry_name)

    @functools.wraps(original_entry)
    def iteration_entry(self, *args, **kwargs):
        driver = _driver_for(self)
        if driver is not None:
            driver.before_iteration()
        return original_entry(self, *args, **kwargs)

    setattr(scheduler_cls, entry_name, iteration_entry)

    original_run_batch = scheduler_cls.run_batch

    @functools.wraps(original_run_batch)
    def run_batch(self, batch, *args, **kwargs):
        driver = _driver_for(self)
        if driver is not None:
            driver.on_run_batch(batch)
        return original_run_batch(self, batch, *args, **kwargs)

    scheduler_cls.run_batch = run_batch

    for name in sglang_compat.EVENT_LOOP_METHODS:
        loop = getattr(scheduler_cls, name, None)
        if loop is not None:
            setattr(scheduler_cls, name, _report_crashes(loop))


def _report_crashes(loop):
    @functools.wraps(loop)
    def wrapper(self, *args, **kwargs):
        try:
            return loop(self, *args, **kwargs)
        except BaseException as exc:
            if isinstance(exc, SystemExit) and exc.code in (0, None):
                raise
            tb = traceback.format_exc()
            _write_crash_file(self, tb)
            driver = self.__dict__.get(_DRIVER_ATTR)
            if driver:
                driver.on_crash(tb)
            raise

    return wrapper
