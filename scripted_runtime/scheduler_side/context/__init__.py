"""The script-facing API (runs inside the scheduler process on the driver rank)."""
from scripted_runtime.scheduler_side.context.api import ScriptContext
from scripted_runtime.scheduler_side.context.requests import ReqHandle
from scripted_runtime.scheduler_side.context.waits import WaitTimeout

__all__ = ["ScriptContext", "ReqHandle", "WaitTimeout"]
