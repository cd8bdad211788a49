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
* ``sglang_compat``   - every SGLang-version difference the others rely on.

Patches are applied when the patched module is imported (``post_import``), so
processes that never import the scheduler pay nothing.
"""
from __future__ import annotations

import os

from scripted_runtime.hooks import post_import, sglang_compat

_activated = False


def activate() -> None:
    global _activated
    if _activated:
        return
    _activated = True
    if os.environ.get("SCRIPTED_RUNTIME_DEVICE", "cpu") == "cpu":
        from scripted_runtime.hooks import cpu_enablement

        cpu_enablement.install()
    if os.environ.get("SCRIPTED_RUNTIME_SCHEDULER_HOOK", "1") == "1":
        from scripted_runtime.hooks import scheduler_hook

        post_import.when_imported(sglang_compat.SCHEDULER_MODULE, scheduler_hook.install)
    from scripted_runtime.hooks import fix_toggles, hicache_gate, patches, upstream_harness

    hicache_gate.install(sglang_compat.SCHEDULER_MODULE)  # HiCache copies a script can hold (hicache_gate.py)

    if upstream_harness.requested():
        upstream_harness.install()

    if fix_toggles.requested():
        post_import.when_imported(sglang_compat.SCHEDULER_MODULE, fix_toggles.install_requested)
    if patches.requested():
        post_import.when_imported(sglang_compat.SCHEDULER_MODULE, patches.install_requested)
    from scripted_runtime import extensions

    if extensions.requested():
        post_import.when_imported(sglang_compat.SCHEDULER_MODULE, extensions.install_requested)
