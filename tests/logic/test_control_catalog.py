"""The control catalog (``scripted_runtime/control_catalog.py``) against the
installed SGLang's dispatcher, the context's methods, the known-bug registry
and docs/control-requests.md; and ``ctx.post_http``'s refusals."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from scripted_runtime import control_catalog, known_bugs
from scripted_runtime.hooks import sglang_compat

ROOT = Path(__file__).resolve().parents[2]


def test_the_catalog_lists_exactly_what_the_installed_scheduler_dispatches():
    """A new SGLang release's new control request (or one it dropped) fails
    here, naming it: the catalog and the docs table are then updated for it."""
    dispatched = sglang_compat.dispatched_request_types()
    assert len(dispatched) == len(set(dispatched)) == 47, dispatched
    catalogued = {c.type_name for c in control_catalog.CATALOG}
    assert len(catalogued) == len(control_catalog.CATALOG)
    assert not set(dispatched) - catalogued, f"dispatched, not in the catalog: {set(dispatched) - catalogued}"
    assert not catalogued - set(dispatched), f"in the catalog, not dispatched: {catalogued - set(dispatched)}"


def test_every_scripted_request_names_context_methods_that_exist():
    from scripted_runtime.scheduler_side.context.api import ScriptContext

    for entry in control_catalog.CATALOG:
        if entry.status != "scripted":
            assert not entry.ctx and entry.reason, entry
            continue
        names = re.findall(r"ctx\.(\w+)", entry.ctx)
        assert names, entry
        for name in names:
            assert callable(getattr(ScriptContext, name, None)), (entry.type_name, name)


def test_every_killing_request_is_a_registered_bug_with_that_route_in_its_scenario():
    kills = [c for c in control_catalog.CATALOG if c.status == "kills"]
    assert {c.known_bug for c in kills} == {"send_weights_without_send_group",
                                            "expert_distribution_route_without_recorder"}
    for entry in kills:
        bug = known_bugs.by_name(entry.known_bug)
        path, _, func = bug.scenario.partition(":")
        source = (ROOT / path).read_text()
        body = source[source.index(f"def {func}("):]
        body = body[:body.find("\ndef ", 1)]
        assert any(route in body for route in entry.routes), (entry.type_name, bug.scenario)
        helper = source[source.index("def _post_then_serve("):]
        helper = helper[:helper.find("\ndef ", 1)]
        assert "unchecked=True" in body or ("_post_then_serve(" in body and "unchecked=True" in helper), \
            "the scenario must pass ctx.post_http's refusal on purpose"


@pytest.mark.parametrize("route, method, expected", [
    ("/flush_cache", "POST", "script it with ctx.flush_cache"),
    ("/flush_cache?timeout=3", "GET", "script it with ctx.flush_cache"),
    ("/generate", "POST", "ctx.start_req / ctx.send_generate"),
    ("/send_weights_to_remote_instance", "POST", "known bug send_weights_without_send_group"),
    ("/start_expert_distribution_record", "GET", "known bug expert_distribution_route_without_recorder"),
    ("/init_weights_update_group", "POST", "script it with ctx.init_weights_update_group"),
    ("/init_weights_send_group_for_remote_instance", "POST", "waits for the remote instance's ranks"),
    ("/start_profile", "POST", "script it with ctx.start_profile"),
    ("/configure_logging", "POST", "script it with ctx.configure_logging"),
    ("/classify", "POST", None),
    ("/load_lora_adapter", "POST", "script it with ctx.load_lora_adapter"),
    ("/load_lora_adapter_from_tensors", "POST", "script it with ctx.load_lora_adapter_from_tensors"),
    ("/hicache/storage-backend", "DELETE", None),
    ("/health", "GET", None),
    ("/v1/models", "GET", None),
])
def test_post_http_refuses_scripted_killing_and_blocking_routes_with_one_line(route, method, expected):
    refusal = control_catalog.post_refusal(route, method)
    if expected is None:
        assert refusal is None
        return
    assert expected in refusal and "\n" not in refusal
    assert "docs/control-requests.md row" in refusal and "unchecked=True" in refusal


def test_routes_map_to_their_request_type():
    assert control_catalog.for_route("/hicache/storage-backend", "PUT").type_name == "AttachHiCacheStorageReqInput"
    assert control_catalog.for_route("/hicache/storage-backend", "DELETE").type_name == \
        "DetachHiCacheStorageReqInput"
    assert control_catalog.for_route("/dumper/status").row == 43
    assert control_catalog.for_route("/stop_profile/").type_name == "ProfileReq"
    assert control_catalog.for_route("/nothing") is None


def test_the_docs_table_names_each_request_types_status():
    """Each row of docs/control-requests.md's table says what the catalog
    says: `scripted ...` for a scripted type, `not scripted (`STATUS`)` for
    the others (row 32 holds a scripted query and an unscripted one)."""
    text = (ROOT / "docs" / "control-requests.md").read_text()
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\| (\d+) \|", line)
        if m:
            rows[int(m.group(1))] = line.split(" | ")[-1]
    assert sorted(rows) == list(range(1, 47))
    for entry in control_catalog.CATALOG:
        last = rows[entry.row]
        if entry.status == "scripted":
            assert "scripted (" in last or last.startswith("every request"), (entry.row, last[:80])
        elif entry.row != 32:
            assert last.startswith(f"not scripted (`{entry.status}`)"), (entry.row, last[:80])


def test_the_controls_command_prints_the_catalog_and_filters_by_status():
    run = lambda *a: subprocess.run([sys.executable, "-m", "scripted_runtime.user_side.cli", "controls", *a],
                                    capture_output=True, text=True, timeout=120)
    out = run()
    assert out.returncode == 0, out.stderr
    assert "47 request types:" in out.stdout and "SendWeightsToRemoteInstanceReqInput" in out.stdout
    kills = run("--status", "kills")
    assert kills.returncode == 0 and "2 request types: 2 kills" in kills.stdout
    assert "FlushCacheReqInput" not in kills.stdout
    bad = run("--status", "nope")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
