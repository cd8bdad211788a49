"""``ScriptedServer``'s helpers (``user_side/server.py``): a script target
from a function or a spec, and the last traceback in a server log. No
SGLang process."""
from __future__ import annotations

import pytest

from scripted_runtime.protocol import ScriptTarget
from scripted_runtime.user_side.server import last_traceback, script_target


def test_script_target_forms(tmp_path):
    def local(ctx):
        yield

    t = script_target(local)
    assert t.qualname.endswith("local") and t.path == __file__
    assert script_target("pkg.mod:fn") == ScriptTarget(qualname="fn", module="pkg.mod")
    assert script_target("a/b.py:fn").path.endswith("a/b.py")
    with pytest.raises(ValueError, match="PATH.py:FUNCTION"):
        script_target("nocolon")


def test_last_traceback_extracts_final_block():
    log = "noise\nTraceback (most recent call last):\n  File x\nValueError: first\nmore\n" \
          "Traceback (most recent call last):\n  File y\n    boom()\nRuntimeError: second\ntrailing"
    tb = last_traceback(log)
    assert tb.startswith("Traceback") and tb.endswith("RuntimeError: second")
