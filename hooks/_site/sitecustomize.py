"""Loaded by every Python process the harness starts (PYTHONPATH points here).

It does nothing unless SCRIPTED_RUNTIME_HOOKS=1, which only the harness sets
for the SGLang server it launches; SGLang's spawned scheduler ranks inherit it.
"""
import os

if os.environ.get("SCRIPTED_RUNTIME_HOOKS") == "1":
    import hooks

    hooks.activate()
