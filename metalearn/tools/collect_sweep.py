"""Gather a sweep's eval.json files into one table.

    python -m metalearn.tools.collect_sweep multirun/sinusoid_maml/2026-11-21_10-00-00 \
        [--csv out.csv]

Each run directory's overrides (from ``.hydra/overrides.yaml``) become columns, then one row per
evaluation record (metric, ways, shots, steps, mean, ci95, median, diverged, nonfinite, tasks).
Run directories without a readable ``eval.json`` (unfinished, failed or damaged runs) are listed
at the end with the reason (the job's ``status.json`` message when it failed), not silently
dropped; so are runs tabulated without their overrides (no ``.hydra/overrides.yaml``).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import yaml

from metalearn.cli import OneLineParser, check_output_file
from metalearn.runner.sweeps import job_dirs, read_status, status_record
from metalearn.tools import check_eval_record

RECORD_COLUMNS = [
    "metric",
    "ways",
    "shots",
    "steps",
    "mean",
    "ci95",
    "median",
    "change",
    "diverged",
    "nonfinite",
    "tasks",
]
NOT_SHOWN = {"run", "median_ci95", "change_ci95"}  # these intervals stay in eval.json


def run_overrides(run_dir: Path) -> dict[str, str] | None:
    """The run's overrides by key, or None when it has no ``.hydra/overrides.yaml``."""
    path = run_dir / ".hydra" / "overrides.yaml"
    if not path.exists():
        return None
    items = yaml.safe_load(path.read_text()) or []
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise ValueError("not a list of overrides")
    overrides = {}
    for item in items:
        key, _, value = item.partition("=")
        if key.lstrip("+") not in ("experiment", "debug", "hydra.run.dir", "hydra.sweep.dir"):
            overrides[key] = value
    return overrides


def read_records(run_dir: Path) -> tuple[list[dict], str]:
    """The run's eval.json records, or none and why there are none."""
    eval_path = run_dir / "eval.json"
    status = read_status(run_dir)
    if status is not None and status["status"] == "refused":  # the rerun changed nothing
        status = status_record(status.get("previous"))  # None if malformed
    if status is not None and status["status"] != "ok":
        return [], f"{status['status']}: {status['message']}"
    if not eval_path.exists():
        return [], "unfinished (no eval.json)"
    try:
        records = json.loads(eval_path.read_text())
        if not isinstance(records, list):
            raise ValueError("not a list of records")
        for record in records:  # a mean of "0.35" was tabulated as it was
            check_eval_record(record)
    except (OSError, ValueError) as err:  # json.JSONDecodeError is a ValueError
        return [], f"unreadable eval.json ({str(err).splitlines()[0]})"
    if not records:  # the run was left out of the table without a word
        return [], "eval.json holds no records"
    return records, ""


def collect(sweep_dir: Path) -> tuple[list[dict], list[tuple[Path, str]], list[Path]]:
    """Rows of every readable run, ``(run_dir, reason)`` for every other one, and the runs
    tabulated without their overrides (no ``.hydra/overrides.yaml``)."""
    rows, missing, unlabelled = [], [], []
    for run_dir in job_dirs(sweep_dir):
        records, reason = read_records(run_dir)
        if reason:
            missing.append((run_dir, reason))
            continue
        try:
            overrides = run_overrides(run_dir)
        except (OSError, ValueError, yaml.YAMLError) as err:
            mark = getattr(err, "problem_mark", None)  # where yaml's parser stopped
            reason = f"{err.problem}, line {mark.line + 1}" if mark else str(err)
            missing.append((run_dir, f"unreadable .hydra/overrides.yaml ({reason})"))
            continue
        if overrides is None:
            unlabelled.append(run_dir)
        rows.extend({"run": run_dir.name, **(overrides or {}), **record} for record in records)
    return rows, missing, unlabelled


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m metalearn.tools.collect_sweep", description=__doc__.splitlines()[0]
    )
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--csv", type=Path, default=None, help="also write the table as CSV")
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        what = "is a file, not a directory" if args.sweep_dir.exists() else "does not exist"
        print(
            f"error: {args.sweep_dir} {what}: give a sweep's output directory, e.g. "
            "multirun/NAME/DATE_TIME",
            file=sys.stderr,
        )
        return 2
    if args.csv:
        try:  # not over a run's eval.json, status.json, ... (they were replaced by the table)
            check_output_file(args.csv, "--csv", "sweep.csv")
        except ValueError as err:  # before collecting, not after printing the table
            print(f"error: {err}", file=sys.stderr)
            return 2
    rows, missing, unlabelled = collect(args.sweep_dir)
    if not rows:
        for run_dir, reason in missing:
            print(f"{run_dir}: {reason}", file=sys.stderr)
        if not missing:
            print(
                f"error: no run directories (with train.log, .hydra/ or status.json) under "
                f"{args.sweep_dir}: give a sweep's "
                "output directory, e.g. multirun/NAME/DATE_TIME",
                file=sys.stderr,
            )
        else:
            print(
                f"error: no readable run under {args.sweep_dir}: each is listed above with why",
                file=sys.stderr,
            )
        return 2
    override_keys = sorted({k for r in rows for k in r} - set(RECORD_COLUMNS) - NOT_SHOWN)
    columns = ["run", *override_keys, *[c for c in RECORD_COLUMNS if any(c in r for r in rows)]]
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(widths[c]) for c in columns))
    for run_dir, reason in missing:
        print(f"{run_dir}: {reason}")
    for run_dir in unlabelled:
        print(f"{run_dir}: no .hydra/overrides.yaml, so its override columns are blank")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
    return 0


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
