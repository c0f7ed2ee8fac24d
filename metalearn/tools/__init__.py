"""Command-line tools that come with the package, each run as ``python -m metalearn.tools.NAME``
(``collect_sweep``, ``plot_learning_curves``, ``plot_sinusoid``, ``plot_rl_returns``,
``prepare_data``), and what they share. Benchmarks and reference implementations stay in
``scripts/``.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

from metalearn.cli import check_output_file


def require_matplotlib() -> ModuleType:
    """``matplotlib`` with the file-only Agg backend; one ``error:`` line and exit 2 without it."""
    try:
        import matplotlib
    except ImportError:
        print(
            "error: the plots need matplotlib: pip install 'metalearn-jax[plot]' "
            "(in a checkout: pip install '.[plot]')",
            file=sys.stderr,
        )
        sys.exit(2)
    matplotlib.use("Agg")
    return matplotlib


def save_figure(fig, out, fmt: str, dpi: int) -> None:
    """Lay out ``fig`` and write it to ``out`` as given, in format ``fmt``; ValueError (one line)
    when matplotlib cannot draw it (a ``$...$`` label it cannot parse, ``.pgf`` without LaTeX)."""
    try:
        fig.tight_layout()  # it lays out the text, parsing it
        fig.savefig(out, dpi=dpi, format=fmt)
    except (ValueError, RuntimeError) as err:
        reason = " ".join(str(err).split())[:300] or type(err).__name__
        raise ValueError(
            f"matplotlib cannot write {out} ({type(err).__name__}: {reason}); in labels and "
            "titles write a dollar sign as \\$ (between two $ matplotlib reads TeX math), or "
            "choose another --out format (.png, .pdf, .svg)"
        ) from None


def is_number(value: object) -> bool:
    """An int or float as JSON gives them (``True`` is not a number here).

    >>> is_number(0.5), is_number(True), is_number("1")
    (True, False, False)
    """
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_count(value: object) -> bool:
    """A non-negative int as JSON gives it (0, 1, 2, ...; ``True`` is not one).

    >>> is_count(3), is_count(-1), is_count(2.0), is_count(True)
    (True, False, False, False)
    """
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_float(value: object) -> bool:
    """A number (:func:`is_number`) that a float can hold (NaN and the infinities included).

    >>> is_float(0.5), is_float(float("nan")), is_float(10**400)
    (True, True, False)
    """
    if not is_number(value):
        return False
    try:
        float(value)
    except OverflowError:
        return False
    return True


def check_eval_record(record: object) -> None:
    """Raise ValueError (a phrase to follow the file's name) unless ``record`` reads as an
    ``eval.json`` record.

    >>> check_eval_record({"metric": "mse", "shots": 5, "steps": 10, "mean": 0.35, "ci95": None})
    >>> check_eval_record({"metric": "mse", "shots": 5, "steps": 10, "mean": "0.35"})
    Traceback (most recent call last):
    ValueError: a record with mean '0.35', not a number or null
    """
    if not isinstance(record, dict) or not {"metric", "shots", "steps", "mean"} <= record.keys():
        raise ValueError(f"a record without metric, shots, steps and mean: {record!r}")
    if not isinstance(record["metric"], str):
        raise ValueError(f"a record with metric {record['metric']!r}, not a metric's name")
    for key in ("shots", "steps", "ways", "tasks", "diverged", "nonfinite"):
        value = record.get(key, 0)
        if not is_count(value) or value > 2**53:  # beyond, a count is not exact as a float
            raise ValueError(f"a record with {key} {value!r}, not a count (0, 1, 2, ...)")
    for key in ("mean", "ci95", "median", "change", "change_ci95"):
        value = record.get(key)
        if value is not None and not is_float(value):
            raise ValueError(f"a record with {key} {value!r}, not a number or null")
        if key.endswith("ci95") and value is not None and value < 0:
            raise ValueError(f"a record with {key} {value!r}: an interval's half-width is >= 0")
    bounds = record.get("median_ci95", [None, None])
    if not isinstance(bounds, list) or len(bounds) != 2:
        raise ValueError(f"a record with median_ci95 {bounds!r}, not a pair [low, high]")
    if any(value is not None and not is_float(value) for value in bounds):
        raise ValueError(f"a record with median_ci95 {bounds!r}, not numbers or null")


def check_image_out(out: str | os.PathLike, flag: str, example: str) -> str:
    """:func:`check_output_file` for a figure, and the format matplotlib writes it in (PNG
    without an extension); ValueError (one line) for a format it cannot write."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    formats = FigureCanvasAgg.get_supported_filetypes()
    suffix = os.path.splitext(os.fspath(out))[1][1:]
    if suffix and suffix.lower() not in formats and not os.path.isdir(out):
        known = ", ".join(f".{f}" for f in sorted(formats))
        raise ValueError(f"{flag} {out}: cannot write '.{suffix}' files; use one of {known}")
    check_output_file(out, flag, example)
    return suffix.lower() or "png"
