"""Patches applied to SGLang inside every process the harness launches.

``activate()`` runs from ``hooks/_site/sitecustomize.py`` when the harness set
SCRIPTED_RUNTIME_HOOKS=1. Each concern lives in its own module:

* ``cpu_enablement``  - lets the real scheduler and a tiny model run on CPU;
* ``scheduler_hook``  - freezes the scheduler loop between script commands;
* ``fix_toggles``     - undoes named SGLang fixes on request (SCRIPTED_RUNTIME_REVERT_FIXES);
* ``patches``         - applies named patches (fix toggles, ``mutants``, a user's
  own ``MODULE:ATTR``) on request (SCRIPTED_RUNTIME_PATCHES);
* ``upstream_harness`` - lets SGLang's own built-in harness run on CPU, for the
  bench (SCRIPTED_RUNTIME_UPSTREAM_HARNESS=1);
* ``hicache_gate``    - holds HiCache's host<->device copies on a script's request;
* ``pause_abort_wake`` - ``pause_generation(abort)`` answers when its last request ends;
* ``sglang_compat``   - every SGLang-version difference the others rely on.

Patches are applied when the patched module is imported (``post_import``), so
processes that never import the scheduler pay nothing.
"""
from __future__ import annotations

import os

from scripted_runtime.hooks import post_import, sglang_compat

_activated = False


def activate() -> None:
    """Every hook this process's environment asks for (a spawned process)."""
    global _activated
    if _activated:
        return
    _activated = True
    activate_common()
    activate_requested()


def activate_common() -> None:
    """The hooks every harness server of a device has, whatever it was asked
    for: what a process template installs before it forks
    (``scripted_runtime/user_side/template_process.py``)."""
    if os.environ.get("SCRIPTED_RUNTIME_DEVICE", "cpu") == "cpu":
        from scripted_runtime.hooks import cpu_enablement

        cpu_enablement.install()
    if os.environ.get("SCRIPTED_RUNTIME_SCHEDULER_HOOK", "1") == "1":
        from scripted_runtime.hooks import scheduler_hook

        post_import.when_imported(sglang_compat.SCHEDULER_MODULE, scheduler_hook.install)
    from scripted_runtime.hooks import pause_abort_wake

    if pause_abort_wake.requested():  # pause(abort) answers when its last request ends (pause_abort_wake.py)
        post_import.when_imported(sglang_compat.TOKENIZER_MANAGER_MODULE, pause_abort_wake.install)
    from scripted_runtime.hooks import hicache_gate

    hicache_gate.install(sglang_compat.SCHEDULER_MODULE)  # HiCache copies a script can hold (hicache_gate.py)


def activate_requested() -> None:
    """The hooks one server was asked for in its environment (reverted
    fixes, patches, extensions, the upstream harness's CPU shims). Each
    applies when the scheduler module is imported, or at once where it
    already is (a process forked from a template)."""
    from scripted_runtime.hooks import fix_toggles, patches, upstream_harness

    if upstream_harness.requested():
        upstream_harness.install()

    if fix_toggles.requested():
        post_import.when_imported(sglang_compat.SCHEDULER_MODULE, fix_toggles.install_requested)
    if patches.requested():
        post_import.when_imported(sglang_compat.SCHEDULER_MODULE, patches.install_requested)
    from scripted_runtime import extensions

    if extensions.requested():
        post_import.when_imported(sglang_compat.SCHEDULER_MODULE, extensions.install_requested)
