"""Learning curves from one or more runs' metrics.jsonl, as a PNG.

    python -m metalearn.tools.plot_learning_curves RUN_DIR [RUN_DIR ...] --out curves.png
    python -m metalearn.tools.plot_learning_curves RL_RUN --metrics pre_return,post_return

Left: the training metrics (the query loss after adaptation; for MAML-RL e.g. the return
before and after the inner step) per logged step, all of them or those ``--metrics`` names.
Right: the validation metric at the training shot count, one line per number of inner steps,
with its 95% CI band. An axis is logarithmic when every value on it is positive (losses),
linear otherwise (returns).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from metalearn.cli import OneLineParser, exit_status
from metalearn.tools import (
    check_eval_record,
    check_image_out,
    is_count,
    is_number,
    require_matplotlib,
    save_figure,
)

require_matplotlib()  # the plot extra: one line and exit 2 without it
import matplotlib.pyplot as plt  # noqa: E402


def read_metrics(run_dir: Path) -> tuple[dict[str, list], dict[tuple, list]]:
    """Training series ``{metric: [(step, value)]}`` and validation series by (metric, steps)."""
    train, val = defaultdict(list), defaultdict(list)
    path = run_dir / "metrics.jsonl"
    if run_dir.is_file():
        raise ValueError(f"{run_dir} is a file, not a run directory: give the directory of a run")
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a metalearn run directory?")
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:  # a directory, or bytes that are not text
        raise ValueError(
            f"{path} cannot be read ({type(err).__name__}: {str(err).splitlines()[0]}); "
            "restore it from a copy, or move it away if the run is to start again"
        ) from None
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"a JSON {type(record).__name__}, not a record")
            if "split" not in record or "step" not in record:
                raise ValueError("a record without 'split' and 'step'")
            check_record(record)
            records.append(record)
        except ValueError as err:  # json.JSONDecodeError is a ValueError
            if number < len(lines):
                raise ValueError(
                    f"{path}, line {number}: unreadable ({err}); delete or repair that line"
                ) from None
            # Half-written by a run killed or still running (a resume drops it too).
            print(f"note: {path}: skipped its unreadable last line {number}", file=sys.stderr)
    if not any(r.get("split") == "train" or r.get("eval") for r in records):
        raise ValueError(
            f"{path} has nothing to plot: it needs training records "
            '({"split": "train", "step": ..., "train/<metric>": ...}) or validation records '
            '({"split": "val", "step": ..., "eval": [...]}); has the run logged its first step?'
        )
    for record in records:
        if record["split"] == "train":
            for key, value in record.items():
                if key.startswith("train/") and value is not None:
                    train[key[len("train/") :]].append((record["step"], value))
        else:
            for entry in record.get("eval", []):
                if entry.get("mean") is not None:
                    key = (entry["metric"], entry["shots"], entry["steps"])
                    val[key].append((record["step"], entry["mean"], entry.get("ci95") or 0.0))
    return train, val


def check_record(record: dict) -> None:
    """Raise ValueError unless ``record`` has a step count, numbers (or null) as training
    metrics and a list of evaluation records (:func:`metalearn.tools.check_eval_record`):
    what the plot reads. Each was a TypeError or KeyError traceback.

    >>> check_record({"split": "train", "step": 1, "train/mse": "x"})
    Traceback (most recent call last):
    ValueError: train/mse is 'x', not a number
    """
    step = record["step"]
    if not is_count(step):
        raise ValueError(f"step is {step!r}, not a count of meta-steps")
    for key, value in record.items():
        if key.startswith("train/") and value is not None and not is_number(value):
            raise ValueError(f"{key} is {value!r}, not a number")
    entries = record.get("eval", [])
    if not isinstance(entries, list):
        raise ValueError(f"eval is {entries!r}, not a list of evaluation records")
    for entry in entries:
        check_eval_record(entry)


def axis_scale(values: list[float]) -> str:
    """``"log"`` when every value is positive (a loss), else ``"linear"`` (e.g. returns).

    >>> axis_scale([0.5, 0.1]), axis_scale([-40.0, -4.0]), axis_scale([])
    ('log', 'linear', 'linear')
    """
    return "log" if values and min(values) > 0 else "linear"


def plot(
    run_dirs: list[Path], out: Path, metrics: list[str] | None = None, fmt: str = "png"
) -> None:
    fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(11, 4))
    train_values, val_values = [], []
    for run_dir in run_dirs:
        train, val = read_metrics(run_dir)
        missing = sorted(set(metrics or ()) - set(train))
        if missing:
            raise ValueError(
                f"{run_dir} logged no training metric {', '.join(missing)}; "
                f"it has: {', '.join(sorted(train))}"
            )
        for metric, points in train.items():
            if metrics and metric not in metrics:
                continue
            steps, values = zip(*points, strict=True)
            train_values += values
            ax_train.plot(steps, values, label=f"{run_dir.name}: {metric}")
        for (metric, shots, inner), points in sorted(val.items()):
            steps, means, cis = zip(*points, strict=True)
            val_values += means
            line = ax_val.plot(
                steps,
                means,
                marker="o",
                label=f"{run_dir.name}: {metric}, {shots} shots, {inner} steps",
            )[0]
            low = [m - c for m, c in zip(means, cis, strict=True)]
            high = [m + c for m, c in zip(means, cis, strict=True)]
            ax_val.fill_between(steps, low, high, color=line.get_color(), alpha=0.2)
    ax_train.set(title="training", xlabel="meta-step", yscale=axis_scale(train_values))
    ax_val.set(title="validation (mean, 95% CI)", xlabel="meta-step", yscale=axis_scale(val_values))
    for ax, records in ((ax_train, "training"), (ax_val, "validation")):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        else:  # e.g. a run before its first validation
            print(f"note: no {records} records to plot; that panel is empty", file=sys.stderr)
            ax.text(0.5, 0.5, f"no {records} records", ha="center", transform=ax.transAxes)
        ax.grid(alpha=0.3)
    save_figure(fig, out, fmt, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m metalearn.tools.plot_learning_curves", description=__doc__.splitlines()[0]
    )
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("learning_curves.png"))
    parser.add_argument(
        "--metrics", help="training metrics to draw, comma-separated (default: all logged)"
    )
    args = parser.parse_args(argv)
    metrics = [m for m in args.metrics.split(",") if m] if args.metrics is not None else None

    def work() -> None:
        if metrics == []:  # "--metrics ," or "--metrics ''" drew every metric
            raise ValueError(f"--metrics {args.metrics!r} names no metric: give NAME[,NAME]")
        fmt = check_image_out(args.out, "--out", "learning_curves.png")  # before reading runs
        plot(args.run_dirs, args.out, metrics, fmt)
        print(f"wrote {args.out}")

    return exit_status(work)


if __name__ == "__main__":
    sys.exit(main())
