"""Deterministic scripted-runtime harness for the SGLang scheduler."""
from scripted_runtime.result import ScriptFailedError, ScriptResult
from scripted_runtime.server import ScriptedServer

__all__ = ["ScriptedServer", "ScriptResult", "ScriptFailedError"]
