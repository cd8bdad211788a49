"""Deterministic scripted-runtime harness for the SGLang scheduler.

The harness side is ``ScriptedServer``; the code that runs inside the
scheduler (driver, context) imports submodules directly, so this package
stays cheap to import there.
"""
from scripted_runtime.result import ScriptFailedError, ScriptResult

__all__ = ["ScriptedServer", "ScriptResult", "ScriptFailedError"]


def __getattr__(name):
    if name == "ScriptedServer":
        from scripted_runtime.server import ScriptedServer

        return ScriptedServer
    raise AttributeError(f"module 'scripted_runtime' has no attribute {name!r}")
