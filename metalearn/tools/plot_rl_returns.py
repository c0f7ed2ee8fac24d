"""Average return against inner gradient steps (Finn et al. 2017, Figure 5), from run directories.

    python -m metalearn.tools.plot_rl_returns MAML_RUN PRETRAINED_RUN RANDOM_RUN \\
        --labels MAML pretrained "random init" --out returns.png --table

Each run directory's ``eval.json`` (written by ``python -m metalearn.train``) holds the mean
return over held-out tasks, with its 95% confidence interval, after each number of inner steps;
one line per run, error bars the CI. A JSON file in that format may stand for a run, e.g. a
checkpoint re-evaluated by ``python -m metalearn.evaluate RUN --out FILE``. ``--table`` also
prints the numbers as a Markdown table. Labels default to each run's experiment name
(``config.yaml``'s ``name``; for a file, with the file's stem).
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from pathlib import Path

from metalearn.cli import OneLineParser, exit_status
from metalearn.tools import check_eval_record, check_image_out, require_matplotlib, save_figure

require_matplotlib()  # the plot extra: one line and exit 2 without it
import matplotlib.pyplot as plt  # noqa: E402
import yaml  # noqa: E402

METRIC = "return"


def read_returns(run: Path) -> list[tuple[int, float | None, float | None]]:
    """``[(inner steps, mean return, ci95)]`` from ``run/eval.json`` (or the file ``run``).

    The mean is ``None`` where every task was non-finite, the ci95 where it is unknown (fewer
    than two finite tasks).
    """
    path = run if run.is_file() else run / "eval.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {run} a finished metalearn run?")
    try:
        records = json.loads(path.read_text())
        if not isinstance(records, list):
            kind = {dict: "object", str: "string"}.get(type(records), "scalar")
            raise ValueError(f"a JSON {kind}, not a list")
        for r in records:
            check_eval_record(r)
        metrics = sorted({r["metric"] for r in records})
        records = [r for r in records if r["metric"] == METRIC]
    except (OSError, ValueError) as err:  # json.JSONDecodeError is a ValueError
        raise ValueError(
            f"{path} is not an eval.json list of records ({str(err).splitlines()[0]}); give a "
            "run directory or a file written by python -m metalearn.evaluate RUN --out FILE"
        ) from None
    if not records:
        raise ValueError(
            f"{path} has no '{METRIC}' records (its metrics: {', '.join(metrics) or 'none'}): "
            "not an RL run; give RL runs only (for others: python -m "
            "metalearn.tools.plot_learning_curves or collect_sweep)"
        )
    # A NaN or infinity (a file edited by hand: runs write null) is a non-finite mean, an
    # unknown interval, as null is; plotted, it was a point at nan and a table cell "nan ± inf".
    return sorted((r["steps"], _finite(r["mean"]), _finite(r.get("ci95"))) for r in records)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def default_label(run: Path) -> str:
    """The run's experiment name; for an evaluation file, its run's name and the file's stem."""
    run_dir = (run.parent if run.is_file() else run).resolve()
    name = run_dir.name
    # Without a readable config.yaml (or one that is not a mapping) the directory's name will do.
    with contextlib.suppress(OSError, yaml.YAMLError, AttributeError):
        name = str(yaml.safe_load((run_dir / "config.yaml").read_text()).get("name", name))
    return f"{name} ({run.stem})" if run.is_file() else name


def markdown_table(rows: dict[str, list[tuple[int, float | None, float | None]]]) -> str:
    """One row per run, one column per step count: ``mean ± ci95``, ``± n/a`` where the interval
    is unknown (one task), ``non-finite`` where every task was.

    >>> print(markdown_table({"MAML": [(0, -40.0, 2.0), (1, -12.5, None), (2, None, None)]}))
    | policy | 0 steps | 1 step | 2 steps |
    | --- | --- | --- | --- |
    | MAML | -40.00 ± 2.00 | -12.50 ± n/a | non-finite |
    """
    steps = sorted({s for points in rows.values() for s, _, _ in points})
    head = ["policy"] + [f"{s} step{'s' * (s != 1)}" for s in steps]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for label, points in rows.items():
        cells = {s: _cell(m, c) for s, m, c in points}
        lines.append("| " + " | ".join([label] + [cells.get(s, "") for s in steps]) + " |")
    return "\n".join(lines)


def _cell(mean: float | None, ci95: float | None) -> str:
    if mean is None:
        return "non-finite"
    return f"{mean:.2f} ± {'n/a' if ci95 is None else f'{ci95:.2f}'}"


def plot(
    rows: dict[str, list[tuple[int, float | None, float | None]]],
    out: Path,
    title: str,
    fmt: str = "png",
) -> None:
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for label, points in rows.items():
        # A non-finite mean is a gap in the line; an unknown interval gets no error bar.
        shown = [
            (s, math.nan if m is None else m, math.nan if c is None else c) for s, m, c in points
        ]
        steps, means, cis = zip(*shown, strict=True)
        ax.errorbar(steps, means, yerr=cis, marker="o", capsize=3, label=label)
    all_steps = sorted({s for points in rows.values() for s, _, _ in points})
    ax.set(xlabel="number of gradient steps", ylabel="average return", title=title)
    ax.set_xticks(all_steps)
    ax.legend()
    save_figure(fig, out, fmt, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m metalearn.tools.plot_rl_returns", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "runs", type=Path, nargs="+", help="run directories or evaluation JSON files"
    )
    parser.add_argument("--labels", nargs="+", help="one per run (default: experiment names)")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("rl_returns.png"),
        help="written as given (a PNG without an extension)",
    )
    parser.add_argument("--title", default="2D navigation")
    parser.add_argument("--table", action="store_true", help="print a Markdown table too")
    args = parser.parse_args(argv)

    def work() -> None:
        if args.labels and len(args.labels) != len(args.runs):
            raise ValueError(f"{len(args.labels)} --labels for {len(args.runs)} run directories")
        fmt = check_image_out(args.out, "--out", "returns.png")  # before any run is read
        labels = args.labels or [default_label(r) for r in args.runs]
        blank = next((i for i, label in enumerate(labels, 1) if not label.strip()), None)
        if blank is not None:  # matplotlib left it out of the legend with a UserWarning
            raise ValueError(f"--labels: label {blank} is empty; give each run a name")
        repeated = next((label for label in labels if labels.count(label) > 1), None)
        if repeated is not None:  # a dict keyed by label would keep only the last such run
            raise ValueError(
                f"more than one run is labelled '{repeated}': give distinct --labels, one per run"
            )
        rows = {label: read_returns(run) for label, run in zip(labels, args.runs, strict=True)}
        plot(rows, args.out, args.title, fmt)
        if args.table:
            print(markdown_table(rows))
        print(f"wrote {args.out}")

    return exit_status(work)


if __name__ == "__main__":
    sys.exit(main())
