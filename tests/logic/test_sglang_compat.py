"""The SGLang-version rules (``hooks/sglang_compat.py``): release ordering,
the OpenMP binding rule per release and by feature, the iteration entry by
feature. No SGLang process."""
from __future__ import annotations

import pytest

from scripted_runtime.hooks import sglang_compat


def test_parse_version_orders_releases():
    assert sglang_compat.parse_version("0.5.12.post1") == (0, 5, 12, 1)
    assert sglang_compat.parse_version("0.5.8.post1") < sglang_compat.parse_version("0.5.9")
    assert sglang_compat.parse_version("0.5.23") > sglang_compat.parse_version("0.5.13")


def test_omp_bind_rule_per_release():
    # 0.5.23: one entry per world rank; 0.5.12.post1: one per TP rank (docs/sglang-facts.md, "Older releases")
    assert sglang_compat.omp_bind_rule("0.5.23").value(tp_size=1, pp_size=4, cores=2) == "0|1|0|1"
    assert sglang_compat.omp_bind_rule("0.5.12.post1").value(tp_size=1, pp_size=4, cores=2) == "0-1"
    assert sglang_compat.omp_bind_rule("0.5.23").value(tp_size=1, pp_size=1, cores=2) == "0-1"
    assert sglang_compat.omp_bind_rule("0.5.13").value(tp_size=1, pp_size=4, cores=2) == "0-1"


def test_omp_bind_rule_by_feature(tmp_path):
    pkg = tmp_path / "sglang"
    (pkg / "srt" / "utils").mkdir(parents=True)
    assert not sglang_compat.omp_bind_rule(pkg_dir=str(pkg)).per_world_rank  # 0.5.13 and older
    (pkg / "srt" / "utils" / "numa_utils.py").write_text('os.environ.get("SGLANG_CPU_OMP_THREADS_BIND")')
    assert sglang_compat.omp_bind_rule(pkg_dir=str(pkg)).per_world_rank  # 0.5.2x
    assert sglang_compat.omp_bind_rule().per_world_rank  # the installed 0.5.23


def test_iteration_entry_by_feature():
    import types

    class New:  # 0.5.2x
        def ingest_requests(self): ...
        def recv_requests(self): ...

    class Old:  # <=0.5.12.post1
        def recv_requests(self): ...

    class Receiver:
        def recv_requests(self): ...

    class Mid:  # 0.5.13: the loops call self.request_receiver.recv_requests()
        def init_request_receiver(self): ...

    entry = lambda cls, **extra: sglang_compat.iteration_entry(types.SimpleNamespace(Scheduler=cls, **extra))
    assert (entry(New).owner, entry(New).method, entry(New).on_receiver) == (New, "ingest_requests", False)
    assert (entry(Old).owner, entry(Old).method) == (Old, "recv_requests")
    mid = entry(Mid, SchedulerRequestReceiver=Receiver)
    assert (mid.owner, mid.method, mid.on_receiver) == (Receiver, "recv_requests", True)
    with pytest.raises(RuntimeError, match="no known iteration entry"):
        entry(Mid)
