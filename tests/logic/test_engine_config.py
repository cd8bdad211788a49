"""The engine arguments per device and topology (``user_side/engine_config.py``)
and ``--sglang-arg key=value`` parsing. No SGLang process."""
from __future__ import annotations

import pytest

from scripted_runtime.user_side import engine_config


def test_engine_kwargs_and_topologies():
    kw = engine_config.engine_kwargs("cpu", "pp4", chunked_prefill_size=32)
    assert kw["pp_size"] == 4 and kw["pp_async_batch_depth"] == 2
    assert kw["chunked_prefill_size"] == 32 and kw["device"] == "cpu"
    assert engine_config.engine_kwargs("cpu", "pp1-normal")["disable_overlap_schedule"] is True
    assert engine_config.topology_for(1, True) == "pp1-overlap"
    assert engine_config.topology_for(1, False) == "pp1-normal"
    with pytest.raises(ValueError, match="--pp must be 1 or 4"):
        engine_config.topology_for(2, True)
    with pytest.raises(ValueError, match="topology must be one of"):
        engine_config.engine_kwargs("cpu", "pp8")


def test_parse_engine_args():
    parsed = engine_config.parse_engine_args(
        ["chunked-prefill-size=32", "disable_radix_cache=true", "log_level=info", "x=None"])
    assert parsed == {"chunked_prefill_size": 32, "disable_radix_cache": True, "log_level": "info", "x": None}
    with pytest.raises(ValueError, match="key=value"):
        engine_config.parse_engine_args(["novalue"])
