"""A sweep's jobs as vectorized groups (``hydra/launcher=vectorized``): each group of jobs that
share one compiled program trains as one program, in this process, and each job is recorded
as a job of ``metalearn.train`` records itself (``status.json``, ``error.txt``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

from metalearn import cli
from metalearn.config import check_group_choices, to_objects
from metalearn.registry import selected_parts
from metalearn.runner.cpu_backend import prepare_machine
from metalearn.runner.layout import resume_hint
from metalearn.runner.loop import Job, train_runs
from metalearn.runner.plan import program_key
from metalearn.runner.signals import exit_at_once
from metalearn.runner.sweeps import record_job

log = logging.getLogger("metalearn")
# The format of Hydra's job log (hydra/job_logging: default), for each job's train.log.
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


def run_vectorized(jobs: Sequence[Any], sweep_dir: str, max_runs: int) -> list[float | None]:
    """Train ``jobs`` (each with ``config``: its composed config, ``choices``, ``files`` and
    ``workdir``) in groups of at most ``max_runs`` that share a compiled program; record each
    job's status; return each one's best validation score (None when it failed). A signal
    stops the sweep after its checkpoints are saved, as it stops a sweep of processes."""
    scores: list[float | None] = [None] * len(jobs)
    configs: dict[int, Any] = {}
    for i, job in enumerate(jobs):
        try:
            check_group_choices(job.choices)
            configs[i] = to_objects(job.config)
        except Exception as err:
            _record_failure(job, err, sweep_dir)
    groups: dict[str, list[int]] = {}
    for i, config in configs.items():
        groups.setdefault(program_key(config), []).append(i)
    batches = [g[k : k + max_runs] for g in groups.values() for k in range(0, len(g), max_runs)]
    if batches:
        prepare_machine(configs[batches[0][0]], runs=len(batches[0]))  # before any computation
    for number, batch in enumerate(batches, 1):
        log.info(
            "program %d of %d: %d run(s), jobs %s",
            number,
            len(batches),
            len(batch),
            ", ".join(str(jobs[i].index) for i in batch),
        )
        runs = [Job(configs[i], jobs[i].workdir, jobs[i].files) for i in batch]
        with _job_logs([jobs[i].workdir for i in batch]):
            try:
                outcomes = train_runs(runs, sweep_dir)
            except Exception as err:  # the group's program failed: every run of it did
                outcomes = [err] * len(batch)
        signal = None
        for i, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, Exception):
                _record_failure(jobs[i], outcome, sweep_dir, configs[i])
            elif outcome["interrupted"]:
                signal = outcome["signal"]
                message = f"stopped by signal {signal}"
                record_job(jobs[i].workdir, "interrupted", 128 + signal, message)
            else:
                record_job(jobs[i].workdir, "ok")
                scores[i] = outcome.get("best_val_score")
        if signal is not None:  # the sweep stops too, as a sweep of processes does
            exit_at_once(128 + signal)
    return scores


def _record_failure(job: Any, err: BaseException, sweep_dir: str, config: Any = None) -> None:
    """Record a job that failed, in one line (on stderr, and in its ``status.json``)."""
    hint = resume_hint(job.workdir, sweep_dir)
    parts = selected_parts(config if config is not None else job.config)
    failure = cli.failure_of(err, job.workdir, hint, parts)
    if failure is None:
        message = f"error: {type(err).__name__}: {err}".splitlines()[0]
        details = "".join(traceback.format_exception(err))
        failure = cli.Failure(message, 1, details=details)
    print(f"{failure.message} (job {job.index})", file=sys.stderr)
    if failure.exit_now:
        exit_at_once(failure.code)
    details = "" if failure.status == "refused" else failure.details or failure.message + "\n"
    record_job(job.workdir, failure.status, failure.code, failure.message, details)


@contextlib.contextmanager
def _job_logs(workdirs: Sequence[str]) -> Iterator[None]:
    """Each job's ``train.log`` gets the group's log while it trains (as Hydra's job log)."""
    handlers = []
    for workdir in workdirs:
        os.makedirs(workdir, exist_ok=True)
        handler = logging.FileHandler(os.path.join(workdir, "train.log"), delay=True)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logging.getLogger().addHandler(handler)
        handlers.append(handler)
    try:
        yield
    finally:
        for handler in handlers:
            logging.getLogger().removeHandler(handler)
            handler.close()
