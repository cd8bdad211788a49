"""Errors the harness raises in the user's process (CLI, ScriptedServer,
explore, builds); shared here so no module has to import the command line
front end for them. Scheduler-side errors (``WaitTimeout``,
``InvariantViolation``) live with the code that raises them.
"""


class UsageError(Exception):
    """Bad input from the command line or an API call: the CLI prints it as
    one line and exits 2."""


class HarnessError(RuntimeError):
    pass


class ServerStartError(HarnessError):
    """The server did not come up; the message holds the log tail."""


class EngineArgumentError(ServerStartError):
    """SGLang rejected an engine argument."""


class ServerDeadError(HarnessError):
    """The server is not running (crashed, timed out or shut down)."""
