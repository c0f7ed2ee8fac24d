"""Average return against inner gradient steps (Finn et al. 2017, Figure 5), from run directories.

    python scripts/plot_rl_returns.py MAML_RUN PRETRAINED_RUN RANDOM_RUN \\
        --labels MAML pretrained "random init" --out returns.png --table

Each run directory's ``eval.json`` (written by ``python -m metalearn.train``) holds the mean
return over held-out tasks, with its 95% confidence interval, after each number of inner steps;
one line per run, error bars the CI. A JSON file in that format may stand for a run, e.g. a
checkpoint re-evaluated by ``python -m metalearn.evaluate RUN --out FILE``. ``--table`` also
prints the numbers as a Markdown table. Labels default to each run's experiment name
(``config.yaml``'s ``name``; for a file, with the file's stem).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import yaml  # noqa: E402

METRIC = "return"


def read_returns(run: Path) -> list[tuple[int, float, float]]:
    """``[(inner steps, mean return, ci95)]`` from ``run/eval.json`` (or the file ``run``)."""
    path = run if run.is_file() else run / "eval.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {run} a finished metalearn run?")
    records = [r for r in json.loads(path.read_text()) if r["metric"] == METRIC]
    if not records:
        raise ValueError(f"{path} has no '{METRIC}' records: not an RL run")
    return sorted((r["steps"], r["mean"], r["ci95"] or 0.0) for r in records)


def default_label(run: Path) -> str:
    """The run's experiment name; for an evaluation file, its run's name and the file's stem."""
    run_dir = run.parent if run.is_file() else run
    config = run_dir / "config.yaml"
    name = run_dir.name
    if config.exists():
        name = str(yaml.safe_load(config.read_text()).get("name", run_dir.name))
    return f"{name} ({run.stem})" if run.is_file() else name


def markdown_table(rows: dict[str, list[tuple[int, float, float]]]) -> str:
    """One row per run, one column per step count: ``mean ± ci95``.

    >>> print(markdown_table({"MAML": [(0, -40.0, 2.0), (1, -12.5, 1.0)]}))
    | policy | 0 steps | 1 step |
    | --- | --- | --- |
    | MAML | -40.00 ± 2.00 | -12.50 ± 1.00 |
    """
    steps = sorted({s for points in rows.values() for s, _, _ in points})
    head = ["policy"] + [f"{s} step{'s' * (s != 1)}" for s in steps]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for label, points in rows.items():
        cells = {s: f"{m:.2f} ± {c:.2f}" for s, m, c in points}
        lines.append("| " + " | ".join([label] + [cells.get(s, "") for s in steps]) + " |")
    return "\n".join(lines)


def plot(rows: dict[str, list[tuple[int, float, float]]], out: Path, title: str) -> None:
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for label, points in rows.items():
        steps, means, cis = zip(*points, strict=True)
        ax.errorbar(steps, means, yerr=cis, marker="o", capsize=3, label=label)
    all_steps = sorted({s for points in rows.values() for s, _, _ in points})
    ax.set(xlabel="number of gradient steps", ylabel="average return", title=title)
    ax.set_xticks(all_steps)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "runs", type=Path, nargs="+", help="run directories or evaluation JSON files"
    )
    parser.add_argument("--labels", nargs="+", help="one per run (default: experiment names)")
    parser.add_argument("--out", type=Path, default=Path("rl_returns.png"))
    parser.add_argument("--title", default="2D navigation")
    parser.add_argument("--table", action="store_true", help="print a Markdown table too")
    args = parser.parse_args(argv)
    try:
        if args.labels and len(args.labels) != len(args.runs):
            raise ValueError(f"{len(args.labels)} --labels for {len(args.runs)} run directories")
        labels = args.labels or [default_label(r) for r in args.runs]
        rows = {label: read_returns(run) for label, run in zip(labels, args.runs, strict=True)}
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    plot(rows, args.out, args.title)
    if args.table:
        print(markdown_table(rows))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
