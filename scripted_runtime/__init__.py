"""Deterministic scripted-runtime harness for the SGLang scheduler.

The package is split by the process its code runs in:

* ``scheduler_side/``: runs inside SGLang's scheduler process, on the driver
  rank, while the event loop is frozen between iterations (driver, step
  observer, tokenizer inbox, state views, windows, invariants, the script
  context, control operations, trace recording, the explorer's program
  helpers). It never imports ``user_side``.
* ``user_side/``: runs in the user's process (``ScriptedServer``, launch,
  process control, builds, explore, the CLI, trace rendering). It may read
  the scheduler side's catalogs (invariant and window names), never run it.
* shared, at the top: ``protocol`` (the messages and environment variables
  that cross between the two), ``errors``, ``specs`` (``PATH.py:NAME`` /
  ``MODULE:NAME``: how a user names their code) and ``timeline`` (the
  one-line-per-step format both sides print).

``hooks`` (everything that patches SGLang) is ``scripted_runtime.hooks``.
The wheel installs it there; the repository keeps it at its top level
(``hooks/``), and a checkout maps the name onto that folder (below), so the
same import works from a wheel, an editable install, or a checkout on
``PYTHONPATH`` (a scheduler rank in another build's environment).

``docs/internals.md`` draws the two sides. Public names are imported lazily,
so importing this package inside the scheduler costs nothing.
"""
import importlib.abc
import importlib.util
import os
import sys

__all__ = ["ScriptedServer", "ServerConfig", "ScriptResult", "ScriptFailedError"]


class _CheckoutHooks(importlib.abc.MetaPathFinder):
    """Finds ``scripted_runtime.hooks`` in a checkout's top-level ``hooks/``.
    Its submodules then import through the package's ``__path__``."""

    def __init__(self, folder: str):
        self.folder = folder

    def find_spec(self, fullname, path=None, target=None):
        if fullname != __name__ + ".hooks":
            return None
        return importlib.util.spec_from_file_location(
            fullname, os.path.join(self.folder, "__init__.py"), submodule_search_locations=[self.folder])


def _map_checkout_hooks() -> None:
    from scripted_runtime.module_paths import checkout_hooks_dir

    folder = checkout_hooks_dir()
    if folder is not None and not any(isinstance(f, _CheckoutHooks) for f in sys.meta_path):
        sys.meta_path.insert(0, _CheckoutHooks(folder))


_map_checkout_hooks()


def __getattr__(name):
    if name == "ScriptedServer":
        from scripted_runtime.user_side.server import ScriptedServer

        return ScriptedServer
    if name == "ServerConfig":
        from scripted_runtime.user_side.server_config import ServerConfig

        return ServerConfig
    if name in ("ScriptResult", "ScriptFailedError"):
        from scripted_runtime.user_side import result

        return getattr(result, name)
    raise AttributeError(f"module 'scripted_runtime' has no attribute {name!r}")
