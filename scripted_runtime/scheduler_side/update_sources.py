"""What a weight update loads, as far as the harness knows it (scheduler
process, driver rank), for the ``update_weights`` contract's rule that an
update answering success serves the checkpoint it loaded.

The weights' fingerprint (``weights_fingerprint``: a few sums of the
first parameters, what the output oracle keys its references by) of each
checkpoint is recorded when the oracle's warm-up loads it
(``note_loaded``); a tensor or distributed update ``ctx`` posts from a
checkpoint is tagged with a rid naming its path (``note_posted``); a disk
update names its path itself. An update whose checkpoint was never loaded
by the warm-up, or whose tensors came from elsewhere, is not judged.
"""
from __future__ import annotations

import itertools
import os
from typing import Any, Dict, Optional

# checkpoint path -> the weights fingerprint its load gave during the warm-up
_fingerprints: Dict[str, Any] = {}
# rid of a tensor/distributed update ctx posted -> the checkpoint its tensors came from
_posted: Dict[str, str] = {}
_rids = itertools.count()


def weights_fingerprint(scheduler: Any) -> Any:
    """A few numbers that change when the weights do: sums of the first 64
    values of the first three parameters of this rank's model (None when
    the model cannot be found)."""
    try:
        model = scheduler.tp_worker.model_runner.model
        params = list(zip(range(3), model.named_parameters()))
    except Exception:  # noqa: BLE001 - another release's layout: one key for all weights
        return None
    return tuple(round(float(p.detach().reshape(-1)[:64].double().sum()), 6) for _, (_, p) in params)


def checkpoint_missing(path: Optional[str]) -> bool:
    """Whether a disk update names a checkpoint path where nothing is: 0.5.23
    answers it failure before loading anything (no path: the server's own)."""
    return bool(path) and not os.path.exists(path)


def note_loaded(path: Optional[str], fingerprint: Any) -> None:
    if path and fingerprint is not None:
        _fingerprints[path] = fingerprint


def note_posted(path: Optional[str]) -> Optional[str]:
    """A rid for a tensor or distributed update of ``path``'s tensors (None
    when there is no path: tensors from elsewhere)."""
    if not path:
        return None
    rid = f"weights-update-{next(_rids)}"
    _posted[rid] = path
    return rid


def expected_fingerprint(recv_req: Any) -> Optional[Any]:
    """The fingerprint the weights must have after ``recv_req`` answers
    success, where the harness knows it; else None."""
    path = getattr(recv_req, "model_path", None)
    if path is None:
        path = _posted.pop(getattr(recv_req, "rid", None) or "", None)
    return _fingerprints.get(path) if path else None


def forget() -> None:
    """Drop what was recorded (tests)."""
    _fingerprints.clear()
    _posted.clear()
