"""LoRA adapters loaded and unloaded at run time on a real pp1-lora server
(issue 35, control-request rows 36 and 38): the scenarios with the ``lora``
contract and every check on, the reset's unloads, ``ctx``'s refusals; in
the slow lane a ci exploration of the topology and the kill table of the
LoRA mutants. The contract on fakes: tests/logic/test_lora_contract.py."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import mutate_table

ROOT = Path(__file__).resolve().parents[2]
S = "scenarios/lora.py"


@pytest.fixture(scope="module")
def lora_server():
    """One pp1-lora server (LoRA on, torch_native backend, two adapters a batch)."""
    from scripted_runtime import ScriptedServer

    server = ScriptedServer.start(topology="pp1-lora")
    yield server
    server.shutdown()


def _run(server, target):
    result = server.run(f"{S}:{target}")
    assert result.passed, result.summary()
    return result


def test_adapters_load_serve_and_unload_with_every_check_on(lora_server):
    """An adapter changes the output; an unload posted while its request runs
    reaches the scheduler only after it finished; three adapters' requests
    share two slots and all finish (the lora contract judges every forward);
    the reset unloads all three."""
    served = _run(lora_server, "load_serve_unload").value
    assert served["with_adapter"] != served["base"] and len(served["with_adapter"]) == 6
    outputs = _run(lora_server, "three_adapters_two_slots").value
    assert len(outputs) == 3 and all(len(o) == 4 for o in outputs)
    assert len({tuple(o) for o in outputs}) == 3, "three adapters, three different outputs"
    assert _run(lora_server, "nothing_loaded").value == ["lora0", "lora1", "lora2"]


def test_an_adapter_loaded_from_its_tensors_serves_what_its_files_do(lora_server):
    """``load_lora_adapter_from_tensors`` (control-request row 37): the
    adapter's tensors sent as SGLang's serialized payload serve the tokens
    the same adapter loaded from its folder serves, with the lora contract
    judging the load."""
    out = _run(lora_server, "load_from_tensors").value
    assert out["from_tensors"] == out["from_files"] != out["base"] and out["tensors"] > 0, out


def test_ctx_refuses_what_would_wedge_or_bypass_it_with_one_line(lora_server):
    out = _run(lora_server, "refusals").value
    assert "does not hold that adapter" in out["unloaded"] and "ctx.load_lora_adapter('lora1')" in out["unloaded"]
    assert "no adapter of that name here (offered: lora0, lora1, lora2)" in out["unknown"]
    assert "script it with ctx.load_lora_adapter" in out["raw"]
    assert "has not been processed yet" in out["second"]
    assert all("\n" not in v for v in out.values())


@pytest.mark.slow  # a server of its own and the ci budget (~90 s)
def test_a_ci_lora_exploration_of_the_release_finds_nothing_and_covers_loads_and_unload(tmp_path):
    """``explore --topology pp1-lora --profile ci``: the LoRA corpus (three
    adapters for two slots, an unload of an adapter in use, adapters
    rotating) then the derandomized search; no failure on 0.5.23, the LoRA
    operations (load from files and from tensors, unload) in the coverage
    table, the longest program deterministic."""
    proc = subprocess.run(
        [sys.executable, "-m", "scripted_runtime.user_side.cli", "explore", "--topology", "pp1-lora",
         "--profile", "ci", "--out", str(tmp_path / "found")],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "failures: none" in proc.stdout and "NONDETERMINISTIC" not in proc.stdout + proc.stderr
    table = proc.stdout[proc.stdout.index("coverage, control operation"):]
    for row in ("lora:load", "lora:load_tensors", "lora:unload"):
        assert any(line.strip().startswith(row) for line in table.splitlines()), table


@pytest.mark.slow  # four servers and four ci searches (~5 min)
def test_the_explorer_kills_the_lora_mutants_and_the_kills_replay(tmp_path):
    rows = mutate_table("pp1-lora", tmp_path, "--shrink-time", "5")
    for name in ("mut_lora_admission_forgets_running", "mut_lora_slot_keeps_stale_weights",
                 "mut_lora_tensor_load_unnormalized"):
        assert rows[name]["status"] == "killed" and rows[name]["replays"] is True, rows[name]
