"""Scheduler ranks and the detokenizer forked from the launcher instead of
spawned (CPU servers started from a process template only).

SGLang 0.5.23's launcher sets ``multiprocessing``'s start method to
``spawn`` (``entrypoints/engine.py``, ``_set_envs_and_config``), so every
rank starts a fresh interpreter and imports torch and SGLang again: about
20 s of a pp=4 start on a 2-core box. A launcher forked from a template has
imported all of it already; forking its ranks hands them those modules and
the hooks installed on them.

Safe on CPU only, and only because of what the template guarantees before
it forks (``scripted_runtime/user_side/template_process.py``): one thread,
no OpenMP pool started, no ZMQ context, no CUDA. SGLang's own reason for
``spawn`` is CUDA (a forked child cannot use a context its parent made), so
GPU servers never take this path.
"""
from __future__ import annotations

import multiprocessing

_installed = False


def install() -> None:
    """From now on, in this process, a request for the ``spawn`` start
    method gets ``fork``."""
    global _installed
    if _installed:
        return
    _installed = True
    real = multiprocessing.set_start_method

    def set_start_method(method=None, force=False):
        return real("fork" if method == "spawn" else method, force=force)

    set_start_method.__wrapped__ = real
    multiprocessing.set_start_method = set_start_method
