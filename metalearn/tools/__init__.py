"""Command-line tools that come with the package (a wheel install included), each run as
``python -m metalearn.tools.NAME``:

- ``collect_sweep``: one table of a sweep's ``eval.json`` files;
- ``plot_learning_curves``: training and validation curves from ``metrics.jsonl``;
- ``plot_sinusoid``: MAML's Figure 2 for a sinusoid run;
- ``plot_rl_returns``: the return after 0, 1, 2, 3 inner steps of RL runs (Finn et al. Figure 5);
- ``prepare_data``: build the TFDS datasets ahead of a run (a run also prepares them itself).

Benchmarks, PyTorch peers and the reference implementations stay in the repository's
``scripts/``.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

from metalearn.cli import check_output_file


def require_matplotlib() -> ModuleType:
    """``matplotlib`` with the file-only Agg backend; one ``error:`` line and exit 2 when it is
    not installed (it is the ``plot`` extra, not a dependency)."""
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
    """Lay out ``fig`` and write it to ``out`` as given (without an extension matplotlib would
    write OUT.png), in format ``fmt``; ValueError (one line) when matplotlib cannot draw it: a
    label it reads as mathtext (between ``$`` signs) and cannot parse, or a format that needs a
    program not installed here (``.pgf``: LaTeX)."""
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
    """A number (:func:`is_number`) that a float can hold (an integer of 400 digits cannot;
    NaN and the infinities are floats, read as non-finite results).

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


# The largest count a record may hold: every count up to it is exact as a float, as plotted.
MAX_COUNT = 2**53


def check_eval_record(record: object) -> None:
    """Raise ValueError (a phrase to put after the file's name) unless ``record`` reads as one
    record of ``eval.json`` (or of ``metrics.jsonl``'s ``eval`` list): a metric name, counts of
    shots and inner steps, and numbers or null where the evaluation writes numbers. The one
    check of what ``collect_sweep``, ``plot_rl_returns`` and ``plot_learning_curves`` read.

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
        if not is_count(value) or value > MAX_COUNT:
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
    """:func:`check_output_file` for a figure, and the format matplotlib writes it in (its
    extension, PNG without one); ValueError (one line) for a format it cannot write. Called
    before any run is read."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    formats = FigureCanvasAgg.get_supported_filetypes()
    suffix = os.path.splitext(os.fspath(out))[1][1:]
    if suffix and suffix.lower() not in formats and not os.path.isdir(out):
        known = ", ".join(f".{f}" for f in sorted(formats))
        raise ValueError(f"{flag} {out}: cannot write '.{suffix}' files; use one of {known}")
    check_output_file(out, flag, example)
    return suffix.lower() or "png"
