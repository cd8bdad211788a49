"""The reset fingerprint's diff (``scheduler_side/reset_fingerprint.py``):
each part a reset left behind, named. No SGLang process."""
from __future__ import annotations


def test_reset_fingerprint_diff_names_each_part_left_behind():
    from scripted_runtime.scheduler_side import reset_fingerprint as fp

    fresh = {"rows": tuple(range(12)), "paused": False, "ratio": 0.7}
    assert fp.diff(fresh, dict(fresh)) == []
    reordered = {**fresh, "rows": (1, 0) + tuple(range(2, 12))}
    assert fp.diff(fresh, reordered) == ["rows: the same 12 but in another order (first [1, 0, 2, 3, 4, 5], "
                                         "fresh [0, 1, 2, 3, 4, 5])"]
    leaked = {**fresh, "rows": tuple(range(1, 12)), "paused": True}
    assert fp.diff(fresh, leaked) == ["rows: 11 now, 12 on the fresh engine; missing [0]",
                                      "paused: True now, False on the fresh engine"]
