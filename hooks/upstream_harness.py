"""Lets SGLang's own built-in harness (``sglang.test.scripted_runtime``) run
on a CPU box, for the side-by-side figures of ``bench/compare.py``.

Active when SCRIPTED_RUNTIME_UPSTREAM_HARNESS=1 (the bench also sets
SCRIPTED_RUNTIME_SCHEDULER_HOOK=0, so our own hook stays out of the way). On
top of the CPU enablement every server gets, the upstream package's
``__init__`` must not install its tree-core inspectors: they import test kits
that look for a Rust workspace the wheel does not ship
(``docs/sglang-facts.md``, "Running on CPU"). The inspectors are a debugging
aid of the upstream harness, not part of driving the scheduler.
"""
from __future__ import annotations

import logging
import os

from scripted_runtime.hooks import post_import, sglang_compat

ENV_UPSTREAM_HARNESS = "SCRIPTED_RUNTIME_UPSTREAM_HARNESS"

logger = logging.getLogger("scripted_runtime.hooks")


def requested() -> bool:
    return os.environ.get(ENV_UPSTREAM_HARNESS) == "1"


def _no_tree_core_inspectors(module) -> None:
    def install_tree_core_inspectors() -> None:
        logger.info("upstream scripted-runtime harness: tree-core inspectors left out on CPU")

    install_tree_core_inspectors.__wrapped__ = module.install_tree_core_inspectors
    module.install_tree_core_inspectors = install_tree_core_inspectors


def install() -> None:
    post_import.when_imported(sglang_compat.UPSTREAM_TREE_CORE_INSPECTION_MODULE, _no_tree_core_inspectors)
