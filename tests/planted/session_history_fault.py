"""A planted fault for the session-turn test: a session turn's history loses
the last output token of the turn it continues (in SGLang's
``Session._concat_token_arrays``), so SGLang serves the turn a prompt the
client never sent. Used by tests/server/test_runtime_ops.py (slow lane):
the output oracle, comparing the turn with a fresh request of the client's
history, must fail it."""
from typing import Any

from scripted_runtime.hooks.mutants.base import find_attr, find_module, replace_attr, scheduler_class
from scripted_runtime.hooks.patch_base import Patch


def _install(scheduler_module: Any) -> None:
    scheduler_class(scheduler_module, "session_drops_output")
    module = find_module("sglang.srt.session.session_controller", "session_drops_output")
    cls = find_attr(module, "Session", "session_drops_output", "Session")
    original = cls.__dict__["_concat_token_arrays"].__func__

    def _concat_token_arrays(last_req, req, session_params):
        saved = last_req.output_ids
        last_req.output_ids = saved[:-1]  # the history loses the turn's last output token
        try:
            return original(last_req, req, session_params)
        finally:
            last_req.output_ids = saved

    _concat_token_arrays.__wrapped__ = original
    setattr(cls, "_concat_token_arrays", staticmethod(_concat_token_arrays))


session_drops_output = Patch(name="session_drops_output", summary="a session turn's history loses the last output token",
                             install=_install)
