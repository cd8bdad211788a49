"""Wraps SGLang's ``Scheduler`` so the harness drives it one iteration at a time.

Installed when ``sglang.srt.managers.scheduler`` is imported in a scheduler
rank. Four wrappers, none of which depends on SGLang's built-in
scripted-runtime hook points (older releases have none):

* the iteration entry (``sglang_compat.iteration_entry``: ``ingest_requests``
  on 0.5.2x, the receiver component's ``recv_requests`` on 0.5.13,
  ``Scheduler.recv_requests`` before): on the driver rank, hands control to the script driver *before*
  the scheduler reads its input, so whatever a script sends in step k is
  ingested in iteration k. Other ranks stay in lock-step because they wait in
  the cross-rank broadcast of the received requests.
* ``run_batch``: records every forward launched (driver rank).
* the prefill pass (``get_new_batch_prefill``): the KV room it began with
  and what it admitted (driver rank; the admission budget contract).
* the event loops: an exception that kills a rank is written to the crash
  directory (and sent to the harness from the driver) before it propagates.

Every other rank gets a ``RankAgent`` at its first iteration: it applies the
harness's KV operations the driver rank relays with its requests
(``scheduler_side/rank_ops.py``).
"""
from __future__ import annotations

import functools
import os
import time
import traceback

from scripted_runtime.hooks import sglang_compat
from scripted_runtime import protocol

_DRIVER_ATTR = "_scripted_runtime_driver"


def _driver_for(scheduler):
    driver = scheduler.__dict__.get(_DRIVER_ATTR)
    if driver is None:
        pp_rank, tp_rank, _, _ = sglang_compat.rank_info(scheduler)
        if pp_rank == 0 and tp_rank == 0:
            from scripted_runtime.scheduler_side.driver import Driver

            driver = Driver(scheduler)
        else:
            # Every other rank applies the harness's per-rank KV operations
            # the driver rank relays with its requests (scheduler_side/rank_ops.py).
            from scripted_runtime.scheduler_side.rank_ops import RankAgent

            RankAgent(scheduler)
            driver = False
        scheduler.__dict__[_DRIVER_ATTR] = driver
    return driver or None


def installed_driver(scheduler):
    """The driver this scheduler runs (its driver rank), else None; never
    makes one. For harness-only probes that reach into the driver on purpose
    (``bench/probe_scripts.py``)."""
    return scheduler.__dict__.get(_DRIVER_ATTR) or None


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


# id(receiver component) -> its scheduler. The component is a slotted frozen
# dataclass (no new attributes, no weakrefs); one scheduler per process.
_receiver_owner: dict = {}


def _track_receiver_owner(scheduler_cls) -> None:
    original_init = scheduler_cls.init_request_receiver

    @functools.wraps(original_init)
    def init_request_receiver(self, *args, **kwargs):
        result = original_init(self, *args, **kwargs)
        _receiver_owner[id(self.request_receiver)] = self
        return result

    scheduler_cls.init_request_receiver = init_request_receiver


def install(scheduler_module) -> None:
    scheduler_cls = scheduler_module.Scheduler
    if getattr(scheduler_cls, "_scripted_runtime_installed", False):
        return
    scheduler_cls._scripted_runtime_installed = True

    entry = sglang_compat.iteration_entry(scheduler_module)
    original_entry = getattr(entry.owner, entry.method)
    if entry.on_receiver:
        _track_receiver_owner(scheduler_cls)

    @functools.wraps(original_entry)
    def iteration_entry(self, *args, **kwargs):
        scheduler = _receiver_owner.get(id(self)) if entry.on_receiver else self
        driver = _driver_for(scheduler) if scheduler is not None else None
        if driver is not None:
            driver.before_iteration()
        out = original_entry(self, *args, **kwargs)
        if driver is not None and driver.priority_on:
            driver.after_ingest()  # what admission queues from here on is stamped later (priority contract)
        return out

    setattr(entry.owner, entry.method, iteration_entry)

    original_run_batch = scheduler_cls.run_batch

    @functools.wraps(original_run_batch)
    def run_batch(self, batch, *args, **kwargs):
        driver = _driver_for(self)
        if driver is not None:
            driver.on_run_batch(batch)
        return original_run_batch(self, batch, *args, **kwargs)

    scheduler_cls.run_batch = run_batch

    original_prefill_pass = getattr(scheduler_cls, sglang_compat.PREFILL_PASS_METHOD, None)
    if original_prefill_pass is not None:
        @functools.wraps(original_prefill_pass)
        def prefill_pass(self, *args, **kwargs):
            driver = _driver_for(self)
            if driver is None or not driver.admission_judged:
                return original_prefill_pass(self, *args, **kwargs)
            before = driver.before_prefill_pass()
            returned = original_prefill_pass(self, *args, **kwargs)
            driver.after_prefill_pass(before, returned)
            return returned

        setattr(scheduler_cls, sglang_compat.PREFILL_PASS_METHOD, prefill_pass)

    for name in sglang_compat.EVENT_LOOP_METHODS:
        loop = getattr(scheduler_cls, name, None)
        if loop is not None:
            setattr(scheduler_cls, name, report_crashes(loop))


def report_crashes(loop):
    """``loop`` (an event loop) wrapped so that an exception that kills it is
    written to the crash directory and, from the driver, sent to the
    harness before it propagates (also used by patches that replace a loop)."""
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
