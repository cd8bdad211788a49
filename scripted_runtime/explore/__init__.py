"""Compatibility for scenario files written by ``scripted-runtime explore``
before the package was split by process (2026-11-25): they import
``from scripted_runtime.explore import program as explore``. The helpers
live in ``scripted_runtime.scheduler_side.explore.program`` now; new files
import them from there. Nothing else belongs in this package.
"""
from scripted_runtime.scheduler_side.explore import program

__all__ = ["program"]
