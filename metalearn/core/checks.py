"""Argument checks shared by core's functions, so that each bad value gets the same words."""

from __future__ import annotations

import numpy as np


def check_count(name: str, value: object, minimum: int = 1) -> int:
    """``value`` as a Python ``int``, refused unless it is an integer ``>= minimum``.

    NumPy integers count (a loop over ``np.arange`` gives them); bools, floats (even ``2.0``),
    strings and ``None`` do not. ``name`` is how the message names the setting.

    >>> check_count("num_steps", np.int64(3))
    3
    >>> check_count("num_steps", 0)
    Traceback (most recent call last):
    ...
    ValueError: num_steps must be an integer >= 1, got 0
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)
