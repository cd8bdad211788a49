"""Loaded by every Python process the harness starts (PYTHONPATH points here).

It does nothing unless SCRIPTED_RUNTIME_HOOKS=1, which only the harness sets
for the SGLang server it launches; SGLang's spawned scheduler ranks inherit it.
The harness also puts the folder holding ``scripted_runtime`` on PYTHONPATH,
so the import below works in any build's environment.
"""
import os

if os.environ.get("SCRIPTED_RUNTIME_HOOKS") == "1":
    from scripted_runtime import hooks

    hooks.activate()
