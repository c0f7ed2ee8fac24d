"""Sweeps (``-m``): every job runs; each records how it ended; the sweep sums them up.

A job writes ``status.json`` into its directory (``{"status": "ok" | "failed" | "interrupted" |
"refused", "exit_code": ..., "message": ..., "time": ...}``; a failure also writes ``error.txt``
with the traceback when there is one). A rerun that the run directory refuses (another config)
changed nothing in it, so its ``"refused"`` record keeps the job's earlier one as ``"previous"``.
:func:`summarize` gives one line per failed job of a sweep (a rerun of a sweep directory
included); ``metalearn.train`` prints them at the end of the sweep and exits 1 if any failed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

STATUS = "status.json"
ERROR_DETAILS = "error.txt"
# What every job of a sweep leaves in its directory: Hydra's log, opened as the job starts; the
# run's record of its command line; its status, written as it ends.
JOB_MARKS = ("train.log", ".hydra", STATUS)


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
        write_error_details(workdir, details)
    record = {"status": status, "exit_code": exit_code, "message": message, "time": time.time()}
    path = os.path.join(workdir, STATUS)
    if status == "refused":  # the job's directory is as it was: so is its earlier record
        previous = read_status(Path(workdir))
        if previous is not None:
            record["previous"] = previous.get("previous", previous)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=1)
    os.replace(path + ".tmp", path)


def write_error_details(workdir: str, details: str) -> None:
    """Write ``details`` (a traceback) to ``workdir/error.txt``, where a failed job keeps it."""
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, ERROR_DETAILS), "w") as f:
        f.write(details)


def read_status(job_dir: Path) -> dict | None:
    """The job's status record, or None if it wrote none (still running, or killed) or it
    cannot be read as one (a field of the wrong kind included).

    >>> import tempfile
    >>> job = Path(tempfile.mkdtemp())
    >>> _ = (job / STATUS).write_text('{"status": 5, "exit_code": 2, "message": "x"}')
    >>> read_status(job) is None
    True
    >>> _ = (job / STATUS).write_text('{"status": "ok", "exit_code": 0, "message": ""}')
    >>> read_status(job)["status"]
    'ok'
    """
    try:
        record = json.loads((job_dir / STATUS).read_text())
    except (OSError, ValueError):
        return None
    record = status_record(record)
    if record is None or not isinstance(record.get("previous", {}), dict):
        return None
    return record


def status_record(record: object) -> dict | None:
    """``record`` if it has the fields of a job's status record, of the right kinds (a job's
    own record, or the earlier one a refusal keeps as ``previous``); else None."""
    if not (isinstance(record, dict) and {"status", "exit_code", "message"} <= record.keys()):
        return None
    well_formed = isinstance(record["status"], str) and isinstance(
        record.get("time", 0.0), int | float
    )
    return record if well_formed else None


def job_dirs(sweep_dir: Path) -> list[Path]:
    """The directories of a sweep's jobs (each holds one of :data:`JOB_MARKS`), in order."""
    return sorted({p.parent for mark in JOB_MARKS for p in sweep_dir.rglob(mark)})


def _launched_since(job: Path, status: dict | None, since: float) -> bool:
    """Whether this sweep ran ``job``: it recorded how it ended (``status``), or Hydra logged
    its start (a job killed before recording), after ``since`` (a rerun writes into the same
    files, so the directory's own time does not tell)."""
    if status is not None and float(status.get("time", 0.0)) >= since:
        return True
    log = job / "train.log"
    return log.exists() and log.stat().st_mtime >= since


def summarize(sweep_dir: Path, since: float = 0.0) -> tuple[list[str], bool]:
    """Summary lines for the jobs under ``sweep_dir`` run after ``since``; any failure?"""
    found = job_dirs(sweep_dir)
    statuses = {job: read_status(job) for job in found}
    jobs = [job for job in found if _launched_since(job, statuses[job], since)]
    failed = []
    for job in jobs:
        status = statuses[job]
        if status is None:
            failed.append(f"  {job.name}: no status.json (the job did not finish)")
        elif status["status"] != "ok":
            failed.append(
                f"  {job.name}: {status['status']} (exit {status['exit_code']}): "
                f"{status['message']}"
            )
    head = f"sweep: {len(jobs) - len(failed)} of {len(jobs)} job(s) succeeded in {sweep_dir}"
    return [head, *failed], bool(failed)
