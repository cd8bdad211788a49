"""``pause_generation(abort)`` answers when its last request ends, not up to a second later.

SGLang's tokenizer manager (0.5.23 ``TokenizerManager.pause_generation``,
mode ``abort``) loops: abort every request (``abort_request(abort_all=True)``),
return if ``model_update_lock`` is free, else ``asyncio.sleep(1.0)`` and
again. Every request in flight holds that lock as a reader, and a new one
cannot take it while the tokenizer is paused; so the answer comes up to one
second after the last request ended, a second the scheduler spends frozen,
waiting for the harness's next command. Measured with py-spy on a
pp1-normal exploration (2026-11-27): 56% of the scheduler's wall time was a
program waiting for that answer.

Here that one sleep ends as soon as the lock is free (its condition is
notified when the last reader leaves), and never later than SGLang's own
delay. The loop then does what it does after a full sleep: aborts again,
finds the lock free, answers. The scheduler receives the same requests in
the same order; only the tokenizer's idle wait is shorter. A pause that
never becomes free (the known bug ``abort_pause_during_in_place_pause``)
still sleeps its full second per round, forever, as in SGLang.

Applied in every CPU and GPU server the harness starts (``hooks.activate_common``);
``SCRIPTED_RUNTIME_PAUSE_WAKE=0`` leaves SGLang's sleep as it is. A release
whose ``pause_generation`` lacks the loop (``sglang_compat.pause_abort_poll``
says what is looked for) is left unpatched.
"""
from __future__ import annotations

import asyncio
import contextvars
import os
import types
from typing import Any, Optional

from scripted_runtime.hooks import sglang_compat

ENV_SWITCH = "SCRIPTED_RUNTIME_PAUSE_WAKE"
_MARK = "_scripted_runtime_pause_wake"

# the tokenizer manager whose pause_generation is running (set around each call)
_manager: "contextvars.ContextVar[Optional[Any]]" = contextvars.ContextVar("scripted_runtime_pause_manager",
                                                                           default=None)


def requested() -> bool:
    return os.environ.get(ENV_SWITCH, "1") != "0"


def _lock_is_free(lock: Any) -> bool:
    return not (lock._writer_active or lock._readers > 0)


async def wake_or_sleep(delay: float, result: Any = None) -> Any:
    """``asyncio.sleep(delay)`` inside ``pause_generation``: ended early once
    the running manager's ``model_update_lock`` is free. Anywhere else (no
    manager, or a lock of another shape) the plain sleep."""
    lock = getattr(_manager.get(), "model_update_lock", None)
    cond = getattr(lock, "_cond", None)
    if cond is None or not all(hasattr(lock, name) for name in ("_readers", "_writer_active")):
        return await asyncio.sleep(delay, result)

    async def free() -> None:
        async with cond:
            await cond.wait_for(lambda: _lock_is_free(lock))

    try:
        await asyncio.wait_for(free(), timeout=delay)
    except asyncio.TimeoutError:
        pass
    return result


class _AsyncioWithWake(types.ModuleType):
    """``asyncio`` as ``pause_generation`` sees it: ``sleep`` is
    ``wake_or_sleep``, everything else asyncio's own."""

    def __init__(self) -> None:
        super().__init__("asyncio")

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    sleep = staticmethod(wake_or_sleep)


def install(tokenizer_manager_module: Any) -> bool:
    """Wrap ``TokenizerManager.pause_generation``; False (nothing changed)
    where the release's method is not the polling loop this knows."""
    cls = getattr(tokenizer_manager_module, "TokenizerManager", None)
    original = getattr(cls, "pause_generation", None)
    if original is None or getattr(original, _MARK, False):
        return False
    if not sglang_compat.pause_abort_poll(original):
        return False
    scope = dict(original.__globals__)
    scope["asyncio"] = _AsyncioWithWake()
    rebuilt = types.FunctionType(original.__code__, scope, original.__name__, original.__defaults__,
                                 original.__closure__)
    rebuilt.__kwdefaults__ = original.__kwdefaults__

    async def pause_generation(self, obj):
        token = _manager.set(self)
        try:
            return await rebuilt(self, obj)
        finally:
            _manager.reset(token)

    pause_generation.__wrapped__ = original
    pause_generation.__doc__ = original.__doc__
    setattr(pause_generation, _MARK, True)
    cls.pause_generation = pause_generation
    return True
