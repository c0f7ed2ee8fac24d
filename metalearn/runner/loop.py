"""The training loop: jitted meta-steps, periodic validation, checkpoints, final evaluation,
for one run or a group sharing one compiled program, where a failing run is left out while the
others go on."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from metalearn.config import Config
from metalearn.runner.checkpoints import intact_steps, newest_intact_step
from metalearn.runner.devices import InFlight, is_primary_host
from metalearn.runner.evaluation import format_record, selection_score
from metalearn.runner.experiment import build, count_parameters
from metalearn.runner.layout import resume_hint, saved_steps
from metalearn.runner.plan import resolve
from metalearn.runner.preflight import outer_step_settings
from metalearn.runner.reporting import (
    MetricsWriter,
    Progress,
    earlier_processes,
    timed_rate,
)
from metalearn.runner.run import NonFiniteError, Runner, average
from metalearn.runner.rundir import RunDirectory, write_atomically
from metalearn.runner.signals import Interrupted, StopRequest, interruption_behind
from metalearn.runner.steps import all_equal, batch_update_strategy, trained
from metalearn.statistics import json_float

__all__ = ["Job", "NonFiniteError", "chunk_length", "train_and_evaluate", "train_runs"]

log = logging.getLogger("metalearn")


@dataclasses.dataclass
class Job:
    """One run to train: its config, its run directory, and its record files (``files`` of
    :class:`~metalearn.runner.rundir.RunDirectory`; None: ``config.yaml`` from the config)."""

    config: Config
    workdir: str
    files: Mapping[str, str] | None = None


def train_and_evaluate(
    cfg: Config,
    workdir: str,
    *,
    files: Mapping[str, str] | None = None,
    sweep_dir: str | None = None,
) -> dict:
    """Train ``cfg`` in ``workdir`` (resuming if it holds checkpoints), then evaluate; returns
    the summary. ``summary["interrupted"]``: a signal stopped the run (a checkpoint was saved
    first); ``summary["requeue"]``: one was the launcher's requeue signal."""
    return train_runs([Job(cfg, workdir, files)], sweep_dir)[0]


def train_runs(jobs: Sequence[Job], sweep_dir: str | None = None) -> list[dict | Exception]:
    """Train ``jobs`` as one group sharing a compiled program
    (:func:`~metalearn.runner.plan.program_key`), then evaluate each. Returns each job's
    summary or, for a failed job of a group, its exception (one job raises it). A job of a
    group that finished before keeps its saved summary."""
    started = time.perf_counter()
    group = len(jobs) > 1
    outcomes: list[Any] = [None] * len(jobs)
    with contextlib.ExitStack() as held:
        # With several processes, one stopping alone would leave the others in a collective.
        stop = held.enter_context(StopRequest())
        held.enter_context(stop.deferred(when=jax.process_count() > 1))
        built, tasks = [], None  # (job index, experiment, run directory)
        try:
            for i, job in enumerate(jobs):
                try:
                    run_dir = RunDirectory(
                        job.workdir, job.config, job.files, sweep_dir, primary=is_primary_host()
                    )
                    held.enter_context(run_dir.open())
                    if group and _finished(job):
                        outcomes[i] = _saved_summary(job.workdir)
                        continue
                    exp = build(resolve(job.config, runs=len(jobs)), tasks)
                except Exception as err:
                    if not group or interruption_behind(err):
                        raise
                    outcomes[i] = err
                    continue
                if run_dir.new:
                    run_dir.record()
                built.append((i, exp, run_dir))
                tasks = exp.tasks
            if not built:
                return outcomes
            start, leftover = _common_start([jobs[i] for i, _, _ in built])
            kept = [b for k, b in enumerate(built) if k not in leftover]
            exps, dirs = [b[1] for b in kept], [b[2] for b in kept]
            runner = Runner(exps, dirs) if group or len(kept) > 1 else Runner(exps[0], dirs[0])
            try:
                trained_runs = _train(runner, stop, started, start, group)
                for (i, _, _), outcome in zip(kept, trained_runs, strict=True):
                    outcomes[i] = outcome
            finally:
                runner.close()
        except BaseException as err:
            interrupted = interruption_behind(err)
            if interrupted is None:
                raise
            for i, job in enumerate(jobs):
                if outcomes[i] is None:
                    outcomes[i] = _interrupted(job.workdir, sweep_dir, interrupted, stop)
            return outcomes
    if leftover:  # runs a kill left a checkpoint ahead of the others: a group of their own
        rest = [built[k][0] for k in leftover]
        for i, outcome in zip(rest, train_runs([jobs[i] for i in rest], sweep_dir), strict=True):
            outcomes[i] = outcome
    return outcomes


def _interrupted(workdir: str, sweep_dir: str | None, err: Interrupted, stop: StopRequest):
    steps = saved_steps(workdir)
    saved = f"the checkpoint of step {max(steps)} is saved" if steps else "nothing is saved yet"
    hint = resume_hint(workdir, sweep_dir)
    log.warning("%s during %s: %s; %s", err, err.phase or stop.phase, saved, hint)
    return _stopped(max(steps, default=0), err.signum, stop)


def _common_start(jobs: Sequence[Job]) -> tuple[int | None, list[int]]:
    """The step a group resumes from together (None: each run's latest), and the runs a kill
    left a checkpoint ahead without the others' step."""
    if len(jobs) == 1 or not jobs[0].config.trainer.resume:
        return None, []
    intact = [intact_steps(os.path.join(job.workdir, "checkpoints")) for job in jobs]
    newest = [steps[0] if steps else 0 for steps in intact]
    start = min(newest)
    if start == max(newest):
        return None, []
    return start, [k for k, steps in enumerate(intact) if start and start not in steps]


def _finished(job: Job) -> bool:
    evaluated = os.path.exists(os.path.join(job.workdir, "eval.json"))
    newest = newest_intact_step(os.path.join(job.workdir, "checkpoints"))
    return evaluated and (newest or 0) >= job.config.trainer.meta_steps


def _saved_summary(workdir: str) -> dict:
    try:
        with open(os.path.join(workdir, "summary.json")) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        summary = {}
    return {**summary, "interrupted": False, "trained_before": True}


def chunk_length(step: int, cfg: Config, steps_per_call: int) -> int:
    """Meta-steps in the next jitted call: up to ``steps_per_call``, never past a multiple of
    an interval or the last step, so a resumed run replays the same calls."""
    t = cfg.trainer
    intervals = [t.log_every, t.checkpoint_every] + ([t.eval_every] if t.eval_every else [])
    next_boundary = min([t.meta_steps] + [(step // k + 1) * k for k in intervals])
    return min(steps_per_call, next_boundary - step)


class _Runs:
    """Each run's best score, metrics writer and whether it still trains; a failing run of a
    group is recorded, a run alone raises."""

    def __init__(self, runner: Runner, isolate: bool, step: int, best_scores: list[float]):
        self.runner, self.isolate, self.best_scores = runner, isolate, best_scores
        self.alive = list(range(runner.count))
        self.failed: dict[int, Exception] = {}
        self.writers = [
            MetricsWriter(d.path, resume_step=step, enabled=is_primary_host())
            for d in runner.run_dirs
        ]

    def fail(self, index: int, err: Exception) -> None:
        if not self.isolate:
            raise err
        log.error("run %s: %s", self.runner.run_dirs[index].path, err)
        self.failed[index] = err
        self.alive.remove(index)

    def save(self, state, pending) -> None:
        for i in list(self.alive):
            try:
                self.runner.save(state, self.best_scores[i], pending, i)
            except NonFiniteError as err:
                self.fail(i, err)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


def _train(runner: Runner, stop: StopRequest, started: float, start, isolate: bool) -> list:
    plan, t = runner.plan, runner.cfg.trainer
    stop.phase = "the restore of the checkpoint"
    state, best_scores, pending = runner.restore(start)
    stop.phase = "start-up"
    step = start_step = int(runner.part(state, 0).step)
    _log_start(runner, state)
    # A copy on the device: the first training call donates the state's buffers.
    start_params = jax.tree_util.tree_map(jnp.copy, state.meta_params)
    runs = _Runs(runner, isolate, step, best_scores)
    progress = Progress(t.meta_steps, step, t.progress_bar)
    start_time, in_flight = time.perf_counter(), InFlight()
    saved_step = step
    try:
        stop.phase = "training"
        with stop.deferred():
            stopping = False  # agreed by every process, at the end of each call
            alone = jax.process_count() == 1
            while step < t.meta_steps and not stopping and runs.alive:
                n = chunk_length(step, runner.cfg, plan.steps_per_call)
                # Compiling from the state last saved, a stop loses nothing (one process alone).
                compiling = not runner.is_compiled(n) and step == saved_step
                with stop.at_once("compilation", when=compiling and alone):
                    state, metrics = runner.train_call(state, n)
                in_flight.add(metrics)
                step += n
                progress.advance(step)
                pending.append((n, metrics))
                if step % t.log_every == 0 or step == t.meta_steps:
                    _log_training(runs, progress, step, pending)
                    pending = []
                if t.eval_every and step % t.eval_every == 0 and step < t.meta_steps:
                    _validate(runs, state)
                if step % t.checkpoint_every == 0 or step == t.meta_steps:
                    runs.save(state, pending)
                    saved_step = step
                stopping = stop.agreed()
            # Without a call (a finished run rerun), a stop asked before the loop is seen here.
            if stopping or stop.agreed():
                runs.save(state, pending)
                for i in runs.alive:
                    saved = runner.checkpoints[i].directory
                    hint = runner.run_dirs[i].resume_hint()
                    log.warning("stopped at step %d; checkpoint saved in %s; %s", step, saved, hint)
                stopped = _stopped(step, stop.signum, stop)
                return [runs.failed.get(i, stopped) for i in range(runner.count)]
        train_seconds = time.perf_counter() - start_time
        # Compiling calls, validations and saves inside the training loop; the final validation
        # and evaluation below come after it and are in neither number.
        untimed = runner.compile_seconds + runner.pause_seconds
        unchanged = {}
        for i in runs.alive:
            before, after = runner.part(start_params, i), runner.part(state, i).meta_params
            unchanged[i] = step > start_step and bool(all_equal(before, after))
            if unchanged[i]:
                outer = outer_step_settings(runner.exps[i].plan.config.algorithm)
                log.warning(unchanged_warning(outer, start_step, step))
            runner.run_dirs[i].record()
        del start_params
        records = {}
        if runs.alive:
            with stop.at_once("the final validation"):
                _validate(runs, state)
            with stop.at_once("the final test evaluation"):
                records = _final_evaluation(runs, state)
    finally:
        progress.close()
        runs.close()
    outcomes: dict[int, Any] = dict(runs.failed)
    for i in runs.alive:
        outcomes[i] = {
            "interrupted": False,
            "step": step,
            "start_step": start_step,  # the times and rate below are this process's
            "train_seconds": train_seconds,
            "compile_seconds": runner.compile_seconds,
            # Training time less compiling, validation and saves: what steps_per_s is over.
            "timed_seconds": train_seconds - untimed,
            "steps_per_s": timed_rate(
                step - start_step - runner.compile_steps, train_seconds - untimed
            ),
            "task_batching": plan.task_batching,
            "devices": plan.devices,
            "best_val_score": json_float(runs.best_scores[i]),
            "meta_params_changed": None if step == start_step else not unchanged[i],
            "eval": records[i],
            "wall_seconds": time.perf_counter() - started,
            "earlier_processes": earlier_processes(runner.run_dirs[i].path),
            **({"runs_in_program": runner.count} if runner.vectorized else {}),
        }
        _write_json(runner.run_dirs[i].path, "summary.json", outcomes[i])
    return [outcomes[i] for i in range(runner.count)]


def _stopped(step: int, signum: int | None, stop: StopRequest) -> dict:
    return {"interrupted": True, "step": step, "signal": signum, "requeue": stop.requeue}


def _log_start(runner: Runner, state) -> None:
    plan, cfg = runner.plan, runner.cfg
    strategy = plan.task_batching
    if runner.exp.learner.batch_update is not None:  # its outer step, where it differs
        outer = batch_update_strategy(strategy, plan.mesh)
        if outer != strategy:
            strategy = f"{strategy} (the outer step: {outer} across devices)"
    runs = f" x {runner.count} runs in one program" if runner.vectorized else ""
    parameters = count_parameters(runner.part(state, 0).meta_params)
    log.info(
        f"training {cfg.run_name or cfg.name}: {cfg.algorithm.name} on {cfg.data.name}, "
        f"{parameters} parameters{runs}, tasks batched by {strategy}, "
        f"{plan.device_count} {plan.platform} device(s)"
    )
    for warning in plan.warnings:
        log.warning(warning)


def unchanged_warning(outer_settings: str | None, start_step: int, step: int) -> str:
    """What to say when meta-steps left the meta-parameters as they were.

    >>> unchanged_warning(None, 0, 3).split(":")[0]
    'the meta-parameters after step 3 are exactly those of step 0 (the initialisation)'
    """
    start = "step 0 (the initialisation)" if start_step == 0 else f"step {start_step}"
    return (
        f"the meta-parameters after step {step} are exactly those of {start}: "
        f"{step - start_step} meta-steps changed nothing, and the evaluation tests them "
        f"unchanged; check {outer_settings or 'optimizer.lr'}, and the training metrics in "
        "metrics.jsonl (a TRPO step whose line search accepts nothing logs accepted 0)"
    )


def _log_training(runs: _Runs, progress: Progress, step: int, pending: list) -> None:
    """One log line, and per run a metrics.jsonl record or, for a non-finite metric, a failure."""
    runner = runs.runner
    averaged = average(pending)
    per_run = {i: {k: float(np.ravel(v)[i]) for k, v in averaged.items()} for i in runs.alive}
    for i, values in per_run.items():
        if not all(math.isfinite(v) for v in values.values()):
            runs.fail(i, runner.non_finite(step, f"training metrics {values}", i))
    if not runs.alive:
        return
    shown = {k: float(np.mean([per_run[i][k] for i in runs.alive])) for k in averaged}
    rate = progress.update(
        step, shown, runner.compile_seconds + runner.pause_seconds, runner.compile_steps
    )
    timing = {} if rate is None else {"steps_per_s": rate}
    for i in runs.alive:
        train = {f"train/{k}": v for k, v in per_run[i].items()}
        runs.writers[i].write({"step": step, "split": "train", **timing, **train})


def _write_json(workdir: str, name: str, value: Any) -> None:
    if is_primary_host():
        write_atomically(os.path.join(workdir, name), json.dumps(value, indent=2))


def _validate(runs: _Runs, state) -> None:
    """Validate every run; keep each one's parameters if they are its best so far."""
    runner, cfg, started = runs.runner, runs.runner.cfg, time.perf_counter()
    step = int(runner.part(state, 0).step)
    log.info("validation on %d tasks at step %d", cfg.eval.val_tasks, step)
    every = runner.evaluate(trained(state), "val", cfg.eval.val_tasks, [cfg.trainer.shots])
    for i in runs.alive:
        records = every[i]
        runs.writers[i].write({"step": step, "split": "val", "eval": records})
        score = selection_score(records, runner.exps[i].objective, cfg.trainer.shots)
        if score > runs.best_scores[i]:
            runs.best_scores[i] = score
            runner.run_dirs[i].record()
            params = runner.part(trained(state), i)
            runner.best[i].save(step, params, {"step": step, "score": score})
    runner.pause_seconds += time.perf_counter() - started


def _final_evaluation(runs: _Runs, state) -> list[list[dict]]:
    """Each run's test evaluation, of its best-on-validation parameters where it has them."""
    runner, cfg = runs.runner, runs.runner.cfg
    finals, chosen = [], []
    for i in range(runner.count):
        final = runner.part(trained(state), i)
        best = runner.best[i].restore_intact(final) if cfg.eval.select_best else None
        finals.append(best[0] if best is not None else final)
        chosen.append(f"best on validation (step {best[1]['step']})" if best else "final")
    which = chosen[0] if len(set(chosen)) == 1 else "best-on-validation (or final)"
    log.info("final evaluation on %d test tasks with the %s parameters", cfg.eval.num_tasks, which)
    every = runner.evaluate(runner.placed(finals), "test", cfg.eval.num_tasks)
    for i in runs.alive:
        _write_json(runner.run_dirs[i].path, "eval.json", every[i])
        run = f"{os.path.basename(runner.run_dirs[i].path)}: " if runner.vectorized else ""
        for r in every[i]:
            log.info("test %s%s", run, format_record(r))
    return every
