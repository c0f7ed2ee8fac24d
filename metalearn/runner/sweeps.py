"""Sweeps (``-m``): every job runs; each records how it ended (``status.json``, and a failure's
traceback in ``error.txt``); the sweep sums them up (:func:`summarize`)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from metalearn.runner.rundir import write_atomically

STATUS = "status.json"
ERROR_DETAILS = "error.txt"
# What every job of a sweep leaves in its directory, from its start to its end.
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
    if details:
        write_error_details(workdir, details)
    record = {"status": status, "exit_code": exit_code, "message": message, "time": time.time()}
    if status == "refused":  # the job's directory is as it was: so is its earlier record
        previous = read_status(Path(workdir))
        if previous is not None:
            record["previous"] = previous.get("previous", previous)
    write_atomically(os.path.join(workdir, STATUS), json.dumps(record, indent=1))


def write_error_details(workdir: str, details: str) -> None:
    """Write ``details`` (a traceback) to ``workdir/error.txt``, where a failed job keeps it."""
    write_atomically(os.path.join(workdir, ERROR_DETAILS), details)


def read_status(job_dir: Path) -> dict | None:
    """The job's status record, or None if it wrote none or it cannot be read as one.

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
    """``record`` if it has the fields of a job's status record, of the right kinds; else None."""
    if not (isinstance(record, dict) and {"status", "exit_code", "message"} <= record.keys()):
        return None
    if isinstance(record["status"], str) and isinstance(record.get("time", 0.0), int | float):
        return record
    return None


def job_dirs(sweep_dir: Path) -> list[Path]:
    """The directories of a sweep's jobs (each holds one of :data:`JOB_MARKS`), in order."""
    return sorted({p.parent for mark in JOB_MARKS for p in sweep_dir.rglob(mark)})


def summarize(sweep_dir: Path, since: float = 0.0) -> tuple[list[str], bool]:
    """Summary lines for the jobs under ``sweep_dir`` run after ``since``; any failure?"""
    jobs, failed = [], []
    for job in job_dirs(sweep_dir):
        status, log = read_status(job), job / "train.log"
        # This sweep ran it if it recorded its end or logged its start after ``since``.
        ended = status is not None and float(status.get("time", 0.0)) >= since
        if not (ended or (log.exists() and log.stat().st_mtime >= since)):
            continue
        jobs.append(job)
        if status is None:
            failed.append(f"  {job.name}: no status.json (the job did not finish)")
        elif status["status"] != "ok":
            failed.append(
                f"  {job.name}: {status['status']} (exit {status['exit_code']}): "
                f"{status['message']}"
            )
    head = f"sweep: {len(jobs) - len(failed)} of {len(jobs)} job(s) succeeded in {sweep_dir}"
    return [head, *failed], bool(failed)
