"""Errors the harness raises on the caller's side."""


class HarnessError(RuntimeError):
    pass


class ServerStartError(HarnessError):
    """The server did not come up; the message holds the log tail."""


class EngineArgumentError(ServerStartError):
    """SGLang rejected an engine argument."""


class ServerDeadError(HarnessError):
    """The server is not running (crashed, timed out or shut down)."""
