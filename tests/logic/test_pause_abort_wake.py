"""hooks/pause_abort_wake.py on SGLang's own ``TokenizerManager.pause_generation``
(its code, a small stand-in for the manager's state): a pause(abort) answers
when the last request in flight ends, after the same aborts SGLang sends,
and sleeps SGLang's full delay while requests stay in flight."""
from __future__ import annotations

import asyncio
import time
import types
from types import SimpleNamespace

import pytest


from scripted_runtime.hooks import pause_abort_wake


def _sglang_pause_generation():
    from sglang.srt.managers import tokenizer_manager

    fn = tokenizer_manager.TokenizerManager.pause_generation
    return getattr(fn, "__wrapped__", fn)  # SGLang's own, patched or not in this process


def _patched_class():
    module = types.ModuleType("fake_tokenizer_manager")
    module.TokenizerManager = type("TokenizerManager", (), {"pause_generation": _sglang_pause_generation()})
    assert pause_abort_wake.install(module)
    assert not pause_abort_wake.install(module), "installed twice"
    return module.TokenizerManager


def _manager():
    from sglang.srt.utils.aio_rwlock import RWLock

    state = SimpleNamespace(is_pause_cond=asyncio.Condition(), is_pause=False, model_update_lock=RWLock(),
                            aborts=[])
    state.abort_request = lambda abort_all=False: state.aborts.append(abort_all)
    return state


def test_pause_abort_answers_when_the_last_request_ends_after_the_same_aborts():
    cls = _patched_class()

    async def scenario():
        manager = _manager()
        await manager.model_update_lock.acquire_reader()  # a request in flight
        task = asyncio.create_task(cls.pause_generation(manager, SimpleNamespace(mode="abort")))
        await asyncio.sleep(0.05)
        assert not task.done() and manager.aborts == [True], "aborted once, waiting for the request"
        assert manager.is_pause
        await manager.model_update_lock.release_reader()  # the request ended
        # SGLang sleeps 1.0 s between rounds: done within 0.5 s means the release woke it
        await asyncio.wait_for(task, timeout=0.5)
        assert manager.aborts == [True, True], "aborted again after the wait, as after SGLang's full sleep"

    asyncio.run(scenario())


def test_while_a_request_stays_in_flight_the_wait_is_sglangs_full_delay():
    async def scenario():
        manager = _manager()
        await manager.model_update_lock.acquire_reader()
        token = pause_abort_wake._manager.set(manager)
        try:
            t0 = time.monotonic()
            assert await pause_abort_wake.wake_or_sleep(0.2, "r") == "r"
            assert time.monotonic() - t0 >= 0.19, "ended before the delay though the lock stayed held"
        finally:
            pause_abort_wake._manager.reset(token)

    asyncio.run(scenario())


def test_a_pause_of_another_shape_is_left_alone():
    async def pause_generation(self, obj):  # a release that waits another way
        await asyncio.Event().wait()

    module = types.ModuleType("fake_tokenizer_manager")
    module.TokenizerManager = type("TokenizerManager", (), {"pause_generation": pause_generation})
    assert not pause_abort_wake.install(module)
    assert module.TokenizerManager.pause_generation is pause_generation


def test_the_hook_is_on_unless_switched_off(monkeypatch):
    monkeypatch.delenv(pause_abort_wake.ENV_SWITCH, raising=False)
    assert pause_abort_wake.requested()
    monkeypatch.setenv(pause_abort_wake.ENV_SWITCH, "0")
    assert not pause_abort_wake.requested()
