"""The training loop: jitted meta-steps, periodic validation, checkpoints, final evaluation."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from metalearn.config import Config
from metalearn.errors import one_line
from metalearn.runner.devices import InFlight, is_primary_host
from metalearn.runner.evaluation import format_record, selection_score
from metalearn.runner.experiment import build, count_parameters
from metalearn.runner.plan import resolve
from metalearn.runner.preflight import outer_step_settings
from metalearn.runner.reporting import MetricsWriter, Progress, timed_rate
from metalearn.runner.run import NonFiniteError, Runner, average, json_float
from metalearn.runner.rundir import RunDirectory, saved_steps
from metalearn.runner.signals import Interrupted, StopRequest
from metalearn.runner.steps import all_equal, batch_update_strategy, trained

__all__ = ["NonFiniteError", "chunk_length", "train_and_evaluate"]

log = logging.getLogger("metalearn")


def train_and_evaluate(
    cfg: Config,
    workdir: str,
    *,
    files: Mapping[str, str] | None = None,
    sweep_dir: str | None = None,
) -> dict:
    """Train ``cfg`` in ``workdir`` (resuming if it holds checkpoints), then evaluate.

    Writes ``metrics.jsonl``, TensorBoard events, ``checkpoints/``, ``best/``, ``eval.json``
    and ``summary.json``, and the run's record (``config.yaml``, or ``files``:
    :class:`~metalearn.runner.rundir.RunDirectory`). Returns the summary;
    ``summary["interrupted"]`` is true when a signal stopped the run (a checkpoint was saved
    first), and ``summary["requeue"]`` when one of them was the requeue signal of the job's
    launcher (:func:`~metalearn.runner.signals.requeue_signal`).
    """
    started = time.perf_counter()  # before the data are loaded (and prepared, on a first run)
    plan = resolve(cfg)
    run_dir = RunDirectory(workdir, cfg, files, sweep_dir, primary=is_primary_host())
    # With several processes, a stop before the first training call is deferred to its end
    # too: one process stopping alone leaves the others in the next collective operation
    # (the restore, the call), until the coordination service gives up on it.
    with run_dir.open(), StopRequest() as stop, stop.deferred(when=jax.process_count() > 1):
        try:
            runner = Runner(build(plan), run_dir)
            if run_dir.new:
                run_dir.record()
            try:
                return _train(runner, stop, started)
            finally:
                runner.close()
        except Interrupted as err:
            steps = saved_steps(workdir)
            saved = (
                f"the checkpoint of step {max(steps)} is saved" if steps else "nothing is saved yet"
            )
            phase = err.phase or stop.phase
            log.warning("%s during %s: %s; %s", err, phase, saved, run_dir.resume_hint())
            return _stopped(max(steps, default=0), err.signum, stop)


def chunk_length(step: int, cfg: Config, steps_per_call: int) -> int:
    """Meta-steps in the next jitted call: up to ``steps_per_call``, never past a boundary.

    Boundaries are the multiples of the log, eval and checkpoint intervals and the last step, so
    a run resumed from any checkpoint replays exactly the same sequence of calls.
    """
    t = cfg.trainer
    intervals = [t.log_every, t.checkpoint_every] + ([t.eval_every] if t.eval_every else [])
    next_boundary = min([t.meta_steps] + [(step // k + 1) * k for k in intervals])
    return min(steps_per_call, next_boundary - step)


def _train(runner: Runner, stop: StopRequest, started: float) -> dict:
    plan, t = runner.plan, runner.cfg.trainer
    stop.phase = "the restore of the checkpoint"
    state, best_score, pending = runner.restore()
    stop.phase = "start-up"  # opening the metrics writer (it imports tensorboardX) and the bar
    step = start_step = int(state.step)
    _log_start(runner, state)
    # A copy on the device: the first training call donates the state's buffers.
    start_params = jax.tree_util.tree_map(jnp.copy, state.meta_params)
    writer = MetricsWriter(runner.workdir, resume_step=step, enabled=is_primary_host())
    progress = Progress(t.meta_steps, step, t.progress_bar)
    start_time, in_flight = time.perf_counter(), InFlight()
    saved_step = step  # what a resumed run would start from: the checkpoint, or the seed
    try:
        stop.phase = "training"
        with stop.deferred():
            stopping = False  # agreed by every process, at the end of each call
            alone = jax.process_count() == 1
            while step < t.meta_steps and not stopping:
                n = chunk_length(step, runner.cfg, plan.steps_per_call)
                # Compiling from the state last saved, a stop loses nothing: not deferred. With
                # several processes it is: one stopping alone leaves the others in the call's
                # collectives; they all stop after it (StopRequest.agreed).
                compiling = not runner.is_compiled(n) and step == saved_step
                with stop.at_once("compilation", when=compiling and alone):
                    state, metrics = runner.train_call(state, n)
                in_flight.add(metrics)
                step += n
                progress.advance(step)
                pending.append((n, metrics))
                if step % t.log_every == 0 or step == t.meta_steps:
                    _log_training(runner, writer, progress, step, pending)
                    pending = []
                if t.eval_every and step % t.eval_every == 0 and step < t.meta_steps:
                    best_score = _validate(runner, writer, state, best_score)
                if step % t.checkpoint_every == 0 or step == t.meta_steps:
                    runner.save(state, best_score, pending)
                    saved_step = step
                stopping = stop.agreed()
            # Without a call (a finished run rerun), a stop asked before the loop is seen here.
            if stopping or stop.agreed():
                runner.save(state, best_score, pending)
                log.warning(
                    "stopped at step %d; checkpoint saved in %s; %s",
                    step,
                    runner.checkpoints.directory,
                    runner.run_dir.resume_hint(),
                )
                return _stopped(step, stop.signum, stop)
        train_seconds = time.perf_counter() - start_time
        unchanged = step > start_step and bool(all_equal(start_params, state.meta_params))
        if unchanged:
            outer = outer_step_settings(runner.cfg.algorithm)
            log.warning(unchanged_warning(outer, start_step, step))
        del start_params
        runner.run_dir.record()  # a rerun with nothing left to train: its record, now
        with stop.at_once("the final validation"):
            best_score = _validate(runner, writer, state, best_score)
        with stop.at_once("the final test evaluation"):
            records = _final_evaluation(runner, state)
    finally:
        progress.close()
        writer.close()
    untimed = runner.compile_seconds + runner.pause_seconds
    summary = {
        "interrupted": False,
        "step": step,
        # the step this process started from (0, or the checkpoint it resumed): the times and
        # the rate below are this process's; a resumed run's earlier ones are in train.log
        "start_step": start_step,
        "train_seconds": train_seconds,
        "compile_seconds": runner.compile_seconds,
        "steps_per_s": timed_rate(
            step - start_step - runner.compile_steps, train_seconds - untimed
        ),
        "task_batching": plan.task_batching,
        "devices": plan.devices,
        "best_val_score": json_float(best_score),
        # false when this process's meta-steps left the meta-parameters exactly as they were
        "meta_params_changed": None if step == start_step else not unchanged,
        "eval": records,
        # data loading or preparation, compilation, training and evaluation, all together
        "wall_seconds": time.perf_counter() - started,
        "earlier_processes": earlier_processes(runner.workdir),
    }
    _write_json(runner.workdir, "summary.json", summary)
    return summary


def _stopped(step: int, signum: int | None, stop: StopRequest) -> dict:
    """The summary of a run a signal stopped (after ``step``)."""
    return {"interrupted": True, "step": step, "signal": signum, "requeue": stop.requeue}


def _log_start(runner: Runner, state) -> None:
    """The run's first log lines: what trains, where, batched how; the plan's warnings."""
    plan, cfg = runner.plan, runner.cfg
    strategy = plan.task_batching
    if runner.exp.learner.batch_update is not None:  # its outer step, where it differs
        outer = batch_update_strategy(strategy, plan.mesh)
        if outer != strategy:
            strategy = f"{strategy} (the outer step: {outer} across devices)"
    log.info(
        "training %s: %s on %s, %d parameters, tasks batched by %s, %d %s device(s)",
        cfg.run_name or cfg.name,
        cfg.algorithm.name,
        cfg.data.name,
        count_parameters(state.meta_params),
        strategy,
        plan.device_count,
        plan.platform,
    )
    for warning in plan.warnings:
        log.warning(warning)


def unchanged_warning(outer_settings: str | None, start_step: int, step: int) -> str:
    """What to say when ``step - start_step`` meta-steps left the meta-parameters as they were
    (``outer_settings``: what sets the outer step, when not ``optimizer.lr``).

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


# What summary.json says of the process that wrote it (its times and rate are its own).
PROCESS_KEYS = (
    "start_step",
    "step",
    "train_seconds",
    "compile_seconds",
    "steps_per_s",
    "devices",
    "wall_seconds",
)


def earlier_processes(workdir: str) -> list[dict]:
    """The times of the processes that finished this run before (from the ``summary.json``
    about to be replaced): a rerun of a finished run, or one resumed with a longer
    ``trainer.meta_steps``, keeps them instead of overwriting them. Empty when there is no
    readable summary; an unreadable one is kept as ``summary.json.unreadable``, with a warning
    (it was replaced silently, and the times of the processes it listed were lost)."""
    path = os.path.join(workdir, "summary.json")
    try:
        with open(path, "rb") as f:
            previous = json.loads(f.read())
        problem = None if isinstance(previous, dict) else "not a JSON object"
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        problem = one_line(err)
    if problem is not None:
        with contextlib.suppress(OSError):
            os.replace(path, path + ".unreadable")
            log.warning(
                "%s could not be read (%s): kept as %s.unreadable; the new summary lists none "
                "of the earlier processes it held",
                path,
                problem,
                path,
            )
        return []
    earlier = previous.get("earlier_processes")
    earlier = earlier if isinstance(earlier, list) else []
    return [*earlier, {key: previous.get(key) for key in PROCESS_KEYS}]


def _log_training(
    runner: Runner,
    writer: MetricsWriter,
    progress: Progress,
    step: int,
    pending: list[tuple[int, dict]],
) -> None:
    """One log line and one metrics.jsonl record; stop on a non-finite training metric."""
    averaged = average(pending)
    if not all(math.isfinite(v) for v in averaged.values()):
        raise runner.non_finite(step, f"training metrics {averaged}")
    rate = progress.update(
        step, averaged, runner.compile_seconds + runner.pause_seconds, runner.compile_steps
    )
    writer.write(
        {
            "step": step,
            "split": "train",
            **({"steps_per_s": rate} if rate is not None else {}),
            **{f"train/{k}": v for k, v in averaged.items()},
        }
    )


def _write_json(workdir: str, name: str, value: Any) -> None:
    """Write ``workdir/name`` atomically, from the primary host only."""
    if not is_primary_host():
        return
    path = os.path.join(workdir, name)
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=2)
    os.replace(path + ".tmp", path)


def _validate(runner: Runner, writer: MetricsWriter, state, best_score: float) -> float:
    """Evaluate on the validation split; keep the parameters if they are the best so far."""
    cfg, started = runner.cfg, time.perf_counter()
    log.info("validation on %d tasks at step %d", cfg.eval.val_tasks, int(state.step))
    records = runner.evaluate(trained(state), "val", cfg.eval.val_tasks, [cfg.trainer.shots])
    step = int(state.step)
    writer.write({"step": step, "split": "val", "eval": records})
    score = selection_score(records, runner.exp.objective, cfg.trainer.shots)
    if score > best_score:
        best_score = score
        runner.run_dir.record()
        runner.best.save(step, trained(state), {"step": step, "score": score})
    runner.pause_seconds += time.perf_counter() - started
    return best_score


def _final_evaluation(runner: Runner, state) -> list[dict]:
    cfg = runner.cfg
    final, chosen = trained(state), "final"
    best = runner.best.restore_intact(trained(state)) if cfg.eval.select_best else None
    if best is not None:
        final, metadata = best
        chosen = f"best on validation (step {metadata['step']})"
    log.info("final evaluation on %d test tasks with the %s parameters", cfg.eval.num_tasks, chosen)
    records = runner.evaluate(final, "test", cfg.eval.num_tasks)
    _write_json(runner.workdir, "eval.json", records)
    for r in records:
        log.info("test %s", format_record(r))
    return records
