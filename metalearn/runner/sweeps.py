"""Sweeps (``-m``): every job runs; each records how it ended; the sweep sums them up.

A job writes ``status.json`` into its directory (``{"status": "ok" | "failed" | "interrupted",
"exit_code": ..., "message": ...}``; a failure also writes ``error.txt`` with the traceback when
there is one). The :class:`SweepSummary` Hydra callback prints one line per failed job at the end
and exits 1 if any job failed, so the shell sees the sweep fail.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

STATUS = "status.json"


def record_job(
    workdir: str, status: str, exit_code: int = 0, message: str = "", details: str = ""
) -> None:
    """Write ``workdir/status.json`` (and ``error.txt`` with ``details`` when given).

    >>> import tempfile
    >>> d = tempfile.mkdtemp(); record_job(d, "failed", 2, "error: bad")
    >>> read_status(Path(d))["exit_code"]
    2
    """
    os.makedirs(workdir, exist_ok=True)
    if details:
        with open(os.path.join(workdir, "error.txt"), "w") as f:
            f.write(details)
    record = {"status": status, "exit_code": exit_code, "message": message, "time": time.time()}
    path = os.path.join(workdir, STATUS)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=1)
    os.replace(path + ".tmp", path)


def read_status(job_dir: Path) -> dict | None:
    """The job's status record, or None if it wrote none (still running, or killed)."""
    try:
        return json.loads((job_dir / STATUS).read_text())
    except (OSError, ValueError):
        return None


def summarize(sweep_dir: Path, since: float = 0.0) -> tuple[list[str], bool]:
    """Summary lines for the jobs under ``sweep_dir`` started after ``since``; any failure?"""
    jobs = sorted(
        p.parent for p in sweep_dir.rglob(".hydra") if p.is_dir() and p.stat().st_mtime >= since
    )
    failed = []
    for job in jobs:
        status = read_status(job)
        if status is None:
            failed.append(f"  {job.name}: no status.json (the job did not finish)")
        elif status["status"] != "ok":
            failed.append(
                f"  {job.name}: {status['status']} (exit {status['exit_code']}): "
                f"{status['message']}"
            )
    head = f"sweep: {len(jobs) - len(failed)} of {len(jobs)} job(s) succeeded in {sweep_dir}"
    return [head, *failed], bool(failed)


class SweepSummary(Callback):
    """Hydra callback: after a sweep, list its failed jobs and exit 1 if there were any."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._start = time.time() - 1.0  # file times have coarse resolution on some systems

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        lines, any_failed = summarize(Path(str(config.hydra.sweep.dir)), self._start)
        print("\n".join(lines), file=sys.stderr if any_failed else sys.stdout)
        if any_failed:
            sys.exit(1)
