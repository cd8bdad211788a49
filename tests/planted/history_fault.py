"""A planted fault for testing the harness's history recovery (not an
SGLang bug): state that the engine reset does not clear.

After a ``pause_generation`` has been processed, the next engine reset (the
start of the *next* script) arms the fault, and from then on any generate
request that arrives crashes the scheduler. So a program fails only when an
earlier script on the same server paused generation: alone on a fresh
server it passes. Applied with ``--patch tests/planted/history_fault.py:PATCH``.
"""
from scripted_runtime.hooks.patch_base import Patch

_STATE = {"paused": False, "live": False}


def _install(scheduler_module):
    from scripted_runtime.scheduler_side import driver

    scheduler = scheduler_module.Scheduler
    pause = scheduler.pause_generation

    def pause_generation(self, recv_req):
        _STATE["paused"] = True
        return pause(self, recv_req)

    reset = driver.Driver._reset

    def _reset(self, *args, **kwargs):
        if _STATE["paused"]:
            _STATE["live"] = True
        return (yield from reset(self, *args, **kwargs))

    handle = scheduler.handle_generate_request

    def handle_generate_request(self, recv_req):
        if _STATE["live"]:
            raise AssertionError("planted history fault: a request arrived in a script after one that "
                                 "paused generation")
        return handle(self, recv_req)

    scheduler.pause_generation = pause_generation
    driver.Driver._reset = _reset
    scheduler.handle_generate_request = handle_generate_request


PATCH = Patch(name="history_fault", summary="planted: a request crashes the scheduler in any script after one "
              "that paused generation", install=_install, expected="crash")
