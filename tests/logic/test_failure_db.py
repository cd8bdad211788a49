"""The failure database: programs round-trip, keys keep builds apart, and a
failure found by one process is replayed first by another, through a local
directory and through a real redis-server started here on 127.0.0.1."""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripted_runtime.user_side.explore import actions as A, failure_db
from scripted_runtime.user_side.server_config import ServerConfig

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "planted" / "search_probe.py"
PROGRAM = [A.Start(100, 1, 4), A.Steps(3), A.Pause("retract"), A.OnWindow("finished_not_pruned", A.UpdateWeights(True), 24),
           A.AbortOne(1), A.Continue(), A.Flush(), A.AbortAll()]


def test_a_program_round_trips_through_its_encoding():
    assert failure_db.decode(failure_db.encode(PROGRAM)) == PROGRAM
    assert failure_db.decode(b'[{"type": "Teleport"}]') is None  # another grammar's: skipped, not an error


def test_keys_keep_builds_topologies_and_grammars_apart(monkeypatch):
    base = ServerConfig("pp4")
    keys = {failure_db.key(base, "0.5.23"), failure_db.key(base.replace(topology="pp1-normal"), "0.5.23"),
            failure_db.key(base, "0.5.22"), failure_db.key(base.replace(patches=("mut_x",)), "0.5.23"),
            failure_db.key(base.replace(revert_fixes=("pr27446",)), "0.5.23"),
            failure_db.key(base.replace(engine_overrides={"chunked_prefill_size": 32}), "0.5.23")}
    assert len(keys) == 6
    old = failure_db.key(base, "0.5.23")
    monkeypatch.setattr(A, "GRAMMAR_VERSION", A.GRAMMAR_VERSION + 1)
    assert failure_db.key(base, "0.5.23") != old


def test_keys_are_those_earlier_releases_wrote():
    """A database written before ``ServerConfig`` keeps matching: the same
    bytes (pinned), and neither the device, the extensions nor the checks
    (never part of the key) change it."""
    assert failure_db.key(ServerConfig("pp1-normal"), "0.5.23") == \
        f"scripted-runtime:g{A.GRAMMAR_VERSION}:pp1-normal:1da55fdbf649939c".encode()
    config = ServerConfig("pp4", patches=("mut_b", "mut_a"), revert_fixes=("pr27446",),
                          engine_overrides={"enable_x": True, "chunked_prefill_size": 32})
    pinned = f"scripted-runtime:g{A.GRAMMAR_VERSION}:pp4:1749e4fc06fc5a7e".encode()
    assert failure_db.key(config, "0.5.23") == pinned
    assert failure_db.key(config.replace(device="cuda", extensions=("mine.py",), checks=False), "0.5.23") == pinned
    # nor the workaround an exploration adds where a registered race applies (hooks/workarounds.py)
    assert failure_db.key(config.replace(patches=config.patches + ("fence_pp_profiler_stop",)), "0.5.23") == pinned


def test_a_bad_database_is_a_one_line_usage_error():
    for spec, words in (("ftp://x", "expected a directory"), ("redis://127.0.0.1:1", "no Redis server answers")):
        proc = subprocess.run([sys.executable, "-m", "scripted_runtime.user_side.cli", "explore", "--database", spec],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def _probe(database, *extra):
    proc = subprocess.run([sys.executable, str(PROBE), database, *extra], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _replayed_first(database):
    first = _probe(database)
    assert first["stored"], first["progress"]  # it found the planted failure and saved it
    second = _probe(database, "--read-only")
    stored = first["stored"]
    # replayed first, before generation: the first program it runs is a stored one, and it fails at once
    assert second["ran"][0] == stored[0], second["progress"]
    assert any(f"failure database: {len(stored)} stored failing programs first" in l for l in second["progress"])
    assert any(l.startswith("FOUND ContractViolation[pause] after 1 programs") for l in second["progress"])
    return first, second


def test_a_failure_found_by_one_process_is_replayed_first_by_another_local_directory(tmp_path):
    _replayed_first(str(tmp_path / "db"))


@pytest.fixture
def redis_url(tmp_path):
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed: bash ci/install.sh installs it (apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    import redis

    client = redis.Redis(host="127.0.0.1", port=port)
    deadline = time.monotonic() + 20
    try:
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on 127.0.0.1:{port} did not answer within 20 s "
                                       f"(exit code {proc.poll()})")
                time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_a_failure_found_by_one_process_is_replayed_first_by_another_through_redis(redis_url):
    first, second = _replayed_first(redis_url)
    # read-only: the second process saved nothing and deleted nothing
    assert second["stored"] == first["stored"]


def test_a_stored_program_that_passes_now_is_removed(tmp_path):
    db = str(tmp_path / "db")
    store = failure_db.FailureStore(failure_db.open_database(db),
                                    failure_db.key(ServerConfig("pp1-normal"), "0.5.23"))
    fixed = [A.Start(8, 1, 1), A.Flush()]  # no pause: the probe's planted failure is not in it
    store.save(fixed)
    out = _probe(db)
    assert out["ran"][0] == failure_db.encode(fixed).decode()
    assert any("passes now: removed" in l for l in out["progress"])
    assert failure_db.encode(fixed).decode() not in out["stored"]


def test_the_default_database_lives_under_out(tmp_path, monkeypatch):
    """A command writes only under its --out: the default database is OUT/failure-db
    (or $SCRIPTED_RUNTIME_DATABASE), never a folder of the current directory."""
    monkeypatch.delenv("SCRIPTED_RUNTIME_DATABASE", raising=False)
    monkeypatch.chdir(tmp_path)
    db = failure_db.open_database(None, out_dir=tmp_path / "found")
    db.save(b"k", b"v")
    assert (tmp_path / "found" / failure_db.DEFAULT_DIR).is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["found"]
    monkeypatch.setenv("SCRIPTED_RUNTIME_DATABASE", str(tmp_path / "shared"))
    failure_db.open_database(None, out_dir=tmp_path / "found").save(b"k", b"v")
    assert (tmp_path / "shared").is_dir()


@pytest.mark.parametrize("url, shown", [
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ("redis://:s3cret@127.0.0.1:6379", "redis://:***@127.0.0.1:6379"),
    ("redis://ci:s3cret@db.local:6379/2", "redis://ci:***@db.local:6379/2"),
])
def test_a_redis_password_is_never_printed(url, shown):
    assert failure_db.redacted(url) == shown


def test_an_unreachable_redis_is_named_without_its_password():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    with pytest.raises(failure_db.DatabaseError) as err:
        failure_db.open_database(f"redis://:s3cret@127.0.0.1:{port}/0")
    assert "s3cret" not in str(err.value) and f"redis://:***@127.0.0.1:{port}/0" in str(err.value)
