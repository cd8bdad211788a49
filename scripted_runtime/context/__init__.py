"""The script-facing API (runs inside the scheduler process on the driver rank)."""
from scripted_runtime.context.api import ScriptContext
from scripted_runtime.context.requests import ReqHandle
from scripted_runtime.context.waits import WaitTimeout

__all__ = ["ScriptContext", "ReqHandle", "WaitTimeout"]
