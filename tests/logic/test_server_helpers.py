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


def test_the_http_port_is_drawn_outside_the_range_sglang_picks_its_own_ports_from():
    """SGLang 0.5.23 picks its process-group store port from 22000-29999,
    checked free then bound later by the ranks: an HTTP port from that range
    could be taken by a server starting beside this one."""
    from scripted_runtime.hooks import sglang_compat
    from scripted_runtime.user_side import server

    low, high = sglang_compat.SGLANG_OWN_PORT_RANGE
    ports = {server.free_port() for _ in range(50)}
    assert all(server.HTTP_PORT_RANGE[0] <= p < low or p > high for p in ports), sorted(ports)
    assert all(p + 10000 <= 65535 for p in ports)  # 0.5.13's gRPC port


def test_a_start_whose_http_port_was_taken_fails_at_once_naming_it(tmp_path):
    """uvicorn's bind failure leaves SGLang's launcher waiting for good; the
    start reads it off the log and fails with PortTakenError (``_launch``
    then tries another port once) instead of waiting out its timeout."""
    from scripted_runtime.user_side import server

    log = tmp_path / "server.log"
    log.write_text("[2026-11-27 22:12:52] Using fallback token IDs for yes/no (9693/2152)\n")
    fake = server.ScriptedServer.__new__(server.ScriptedServer)
    fake.log_path, fake.http_url = log, "http://127.0.0.1:21234"
    fake._raise_if_port_taken()  # nothing yet
    with log.open("a") as f:
        f.write("[2026-11-27 22:12:52] ERROR:    [Errno 98] error while attempting to bind on address "
                "('127.0.0.1', 21234): address already in use\n")
    with pytest.raises(server.PortTakenError, match=r"http://127.0.0.1:21234 was taken.*Errno 98"):
        fake._raise_if_port_taken()
