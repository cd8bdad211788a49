"""Numeric settings read from environment variables, with one error format."""
from __future__ import annotations

import os


def nonnegative_float(var: str, default: float, *, unit: str, zero_means: str = "") -> float:
    """``$var`` as a number >= 0, ``default`` when unset or blank; a
    ValueError naming the variable, its value and what it expects otherwise."""
    raw = os.environ.get(var, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value != value or value < 0:  # NaN or negative
        hint = f" ({zero_means})" if zero_means else ""
        raise ValueError(f"{var}={raw!r}: expected a number of {unit} >= 0{hint}; unset it for the default "
                         f"{default:g}")
    return value
