"""The training loop: jitted meta-steps, periodic evaluation, checkpoints, final evaluation."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from metalearn.config import Config
from metalearn.data.family_checks import check_family
from metalearn.data.objective_checks import check_objective
from metalearn.data.sources import one_line
from metalearn.registry import selected_parts
from metalearn.runner.checkpoints import DAMAGED, CheckpointStore
from metalearn.runner.devices import InFlight, is_primary_host, replicated, task_mesh
from metalearn.runner.divergence import divergence_advice
from metalearn.runner.evaluation import (
    evaluate_split,
    format_record,
    selection_score,
)
from metalearn.runner.experiment import (
    Experiment,
    build_experiment,
    count_parameters,
    lapack_batch_error,
    lapack_device_warning,
    outer_step_settings,
    unread_final_lr_warning,
)
from metalearn.runner.reporting import MetricsWriter, Progress, timed_rate
from metalearn.runner.rundir import (
    check_rerun,
    record_config,
    resume_hint,
    run_directory_held,
    saved_steps,
)
from metalearn.runner.signals import Interrupted, StopRequest
from metalearn.runner.steps import (
    all_equal,
    all_finite,
    batch_update_strategy,
    make_eval_step,
    make_multi_step,
    trained,
)

log = logging.getLogger("metalearn")


class NonFiniteError(FloatingPointError):
    """Training produced a NaN or an infinity; nothing non-finite was saved."""


def chunk_length(step: int, cfg: Config, steps_per_call: int) -> int:
    """Meta-steps in the next jitted call: up to ``steps_per_call``, never past a boundary.

    Boundaries are the multiples of the log, eval and checkpoint intervals and the last step, so
    a run resumed from any checkpoint replays exactly the same sequence of calls.
    """
    t = cfg.trainer
    intervals = [t.log_every, t.checkpoint_every] + ([t.eval_every] if t.eval_every else [])
    next_boundary = min([t.meta_steps] + [(step // k + 1) * k for k in intervals])
    return min(steps_per_call, next_boundary - step)


class Runner:
    """One run in ``workdir``: owns the compiled steps, the checkpoints and the writers."""

    def __init__(self, cfg: Config, workdir: str, experiment: Experiment | None = None):
        self.cfg, self.workdir = cfg, workdir
        self.exp = experiment or build_experiment(cfg)
        primary = is_primary_host()
        env = selected_parts(cfg).get("data.env")  # an RL family's environment, named too
        family = cfg.data.name + (f", data.env={env}" if env else "")
        check_family(self.exp.tasks, family, cfg.trainer.shots, cfg.eval.shots)
        check_objective(
            self.exp.objective, self.exp.tasks, family, cfg.model.name, cfg.trainer.shots
        )
        lapack_error = lapack_batch_error(
            cfg, self.exp.task_batching, jax.devices()[0].platform, jax.device_count()
        )
        if lapack_error:
            raise ValueError(lapack_error)
        self.checkpoints = CheckpointStore(
            os.path.join(workdir, "checkpoints"), cfg.trainer.keep_checkpoints, primary
        )
        self.best = CheckpointStore(os.path.join(workdir, "best"), 1, primary)
        self.loaded, self.loaded_step = "", -1  # what load_for_evaluation loaded
        self.mesh = task_mesh(cfg.trainer.shard_tasks, cfg.trainer.meta_batch_size)
        self.initial_state = replicated(self.exp.initial_state, self.mesh)
        # A host copy: the first training call donates (deletes) the device buffers.
        self._initial_trained = jax.device_get(trained(self.exp.initial_state))
        self.splits = replicated(self.exp.tasks.splits, self.mesh)
        # The seed's keys and the rates are arguments of the compiled steps, not constants.
        self.hyper = replicated(self.exp.hyper, self.mesh)
        self._meta_step = self.exp.traced_meta_step(
            meta_steps=cfg.trainer.meta_steps,
            meta_batch_size=cfg.trainer.meta_batch_size,
            shots=cfg.trainer.shots,
            mesh=self.mesh,
        )
        self._compiled: dict[int, Any] = {}
        self.compile_seconds = 0.0
        self.compile_steps = 0  # meta-steps run by compiling calls: their time is compile time
        self.pause_seconds = 0.0  # validation and checkpoint saves: with compiling, not in steps/s
        self._eval_step = make_eval_step(
            self.exp.learner,
            self.exp.tasks,
            steps=tuple(cfg.eval.steps),
            strategy=self.exp.task_batching,
            mesh=self.mesh,
        )

    def eval_step(self, trained_params, split_arrays, keys, shots: int):
        """The jitted evaluation of the tasks drawn from ``keys`` (placed on every device)."""
        keys = replicated(keys, self.mesh)
        return self._eval_step(trained_params, split_arrays, keys, shots, self.hyper.learner)

    def train_call(self, state, num_steps: int):
        """Run ``num_steps`` fused meta-steps; compiles (timed) on first use of a length.

        The first call of a new length is waited for and counted as compile time too: XLA
        finishes preparing the program on its first run (~0.2 s for a tiny MLP on a CPU). Its
        steps are counted in ``compile_steps``, so that steps/s counts neither.
        """
        arrays = self.splits["train"]
        if num_steps in self._compiled:
            return self._compiled[num_steps](state, arrays, self.hyper)
        start = time.perf_counter()
        self._compiled[num_steps] = self.lower(state, num_steps).compile()
        result = jax.block_until_ready(self._compiled[num_steps](state, arrays, self.hyper))
        self.compile_seconds += time.perf_counter() - start
        self.compile_steps += num_steps
        log.info("compiled %d fused meta-step(s) in %.1f s", num_steps, time.perf_counter() - start)
        return result

    def is_compiled(self, num_steps: int) -> bool:
        """Whether the program of ``num_steps`` fused meta-steps is compiled already."""
        return num_steps in self._compiled

    def lower(self, state, num_steps: int) -> jax.stages.Lowered:
        """The program of ``num_steps`` fused meta-steps from ``state``, lowered (not compiled)."""
        jitted = make_multi_step(self._meta_step, num_steps)
        return jitted.lower(state, self.splits["train"], self.hyper)

    def evaluate(
        self, trained_params, split: str, num_tasks: int, shots_list=None, on_chunk=None
    ) -> list[dict]:
        """Evaluate ``trained_params`` (a :class:`~metalearn.runner.steps.Trained`)."""
        e = self.cfg.eval
        return evaluate_split(
            self.eval_step,
            trained_params,
            self.splits[split],
            split=split,
            seed=e.seed,
            shots_list=shots_list or e.shots,
            steps=e.steps,
            num_tasks=num_tasks,
            tasks_per_call=min(e.tasks_per_call, num_tasks),
            ways=self.exp.tasks.ways,
            objective=self.exp.objective,
            on_chunk=on_chunk,
        )

    def save(self, state, best_score: float, unlogged: Sequence[tuple[int, dict]] = ()) -> None:
        """Checkpoint ``state``, with the training metrics of the steps since the last log line
        (``unlogged``), so that a resumed run logs the same averages as an uninterrupted one."""
        step, started = int(state.step), time.perf_counter()
        if not bool(all_finite(state.meta_params)):
            raise self.non_finite(step, "parameters")
        metadata = {"step": step, "best_score": _json_float(best_score)}
        if unlogged:
            metadata[UNLOGGED] = {"steps": sum(n for n, _ in unlogged), "mean": _average(unlogged)}
        self.checkpoints.save(step, state, metadata)
        self.pause_seconds += time.perf_counter() - started

    def non_finite(self, step: int, what: str) -> NonFiniteError:
        last = self.checkpoints.newest_intact_step()
        where = f"step {last} in {self.checkpoints.directory}" if last is not None else "none yet"
        good = self._initial_trained
        if last is not None:
            # Unloadable after all: the probe starts from the initial parameters.
            with contextlib.suppress(RuntimeError):
                good = trained(self.checkpoints.restore(self.initial_state, last)[0])
        advice = divergence_advice(self.cfg, self.exp, self.splits["train"], self.mesh, good)
        return NonFiniteError(
            f"non-finite {what} at step {step}; nothing non-finite was saved (last intact "
            f"checkpoint: {where}). Likely cause: {advice}; then rerun in the same run "
            "directory to resume from the last intact checkpoint."
        )

    def close(self) -> None:
        self.checkpoints.close()
        self.best.close()


# Checkpoint metadata key: the step count and mean training metrics of the steps since the last
# log line, which the next log line averages in.
UNLOGGED = "unlogged_train_metrics"


def _json_float(x: float) -> float | None:
    return None if not math.isfinite(x) else float(x)


def _average(pending: list[tuple[int, dict]]) -> dict[str, float]:
    """Step-weighted mean of the metrics of the calls since the last log line."""
    total = sum(n for n, _ in pending)
    host = [(n, jax.device_get(m)) for n, m in pending]
    return {k: float(sum(n * float(m[k]) for n, m in host) / total) for k in host[0][1]}


def train_and_evaluate(cfg: Config, workdir: str) -> dict:
    """Train ``cfg`` in ``workdir`` (resuming if it holds checkpoints), then evaluate.

    Writes ``metrics.jsonl``, TensorBoard events, ``checkpoints/``, ``best/``, ``eval.json``
    and ``summary.json``. Returns the summary; ``summary["interrupted"]`` is true when a signal
    stopped the run (a checkpoint was saved first), and ``summary["requeue"]`` when one of them
    was the requeue signal of the job's launcher (:func:`~metalearn.runner.signals.requeue_signal`).
    """
    started = time.perf_counter()  # before the data are loaded (and prepared, on a first run)
    with run_directory_held(workdir) if is_primary_host() else contextlib.nullcontext():
        prepare_run_directory(cfg, workdir)
        return _train_until_done_or_stopped(cfg, workdir, started)


def _train_until_done_or_stopped(cfg: Config, workdir: str, started: float) -> dict:
    # With several processes, a stop before the first training call is deferred to its end
    # too: one process stopping alone leaves the others in the next collective operation
    # (the restore, the call), until the coordination service gives up on it.
    with StopRequest() as stop, stop.deferred(when=jax.process_count() > 1):
        try:
            runner = Runner(cfg, workdir)
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
            log.warning("%s during %s: %s; %s", err, phase, saved, resume_hint(workdir))
            return {
                "interrupted": True,
                "step": max(steps, default=0),
                "signal": err.signum,
                "requeue": stop.requeue,
            }


def prepare_run_directory(cfg: Config, workdir: str) -> None:
    """Refuse a config that must not run in ``workdir`` (RunDirectoryError), then record it."""
    changed = check_rerun(cfg, workdir)
    os.makedirs(workdir, exist_ok=True)
    if changed:
        log.warning(
            "resuming with changed settings (allowed by trainer.allow_changes): %s",
            ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items()),
        )
    if is_primary_host():
        record_config(cfg, workdir, changed)


def _restore(runner: Runner):
    """``(state, best score, unlogged training metrics)`` of the latest intact checkpoint, or
    of the initialisation."""
    state, best_score, unlogged = runner.initial_state, -math.inf, []
    restored = runner.checkpoints.restore_intact(state) if runner.cfg.trainer.resume else None
    if restored is not None:
        state, metadata = restored
        if metadata.get("best_score") is not None:
            best_score = float(metadata["best_score"])
        if metadata.get(UNLOGGED):  # absent in checkpoints of older versions
            unlogged = [(int(metadata[UNLOGGED]["steps"]), dict(metadata[UNLOGGED]["mean"]))]
        log.info("resumed from step %d (%s)", int(state.step), runner.checkpoints.directory)
    return state, best_score, unlogged


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


def _batching_description(runner: Runner) -> str:
    """The run's task batching for its first log line, with the outer step's where it differs
    (a ``batch_update`` across devices: :func:`~metalearn.runner.steps.batch_update_strategy`)."""
    strategy = runner.exp.task_batching
    if runner.exp.learner.batch_update is None:
        return strategy
    outer = batch_update_strategy(strategy, runner.mesh)
    return strategy if outer == strategy else f"{strategy} (the outer step: {outer} across devices)"


def _train(runner: Runner, stop: StopRequest, started: float) -> dict:
    cfg, t = runner.cfg, runner.cfg.trainer
    stop.phase = "the restore of the checkpoint"
    state, best_score, pending = _restore(runner)
    stop.phase = "start-up"  # opening the metrics writer (it imports tensorboardX) and the bar
    step = start_step = int(state.step)
    log.info(
        "training %s: %s on %s, %d parameters, tasks batched by %s, %d %s device(s)",
        cfg.run_name or cfg.name,
        cfg.algorithm.name,
        cfg.data.name,
        count_parameters(state.meta_params),
        _batching_description(runner),
        jax.device_count(),
        jax.devices()[0].platform,
    )
    for warning in (
        lapack_device_warning(cfg, jax.devices()[0].platform, jax.device_count()),
        unread_final_lr_warning(cfg.optimizer),
    ):
        if warning:
            log.warning(warning)
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
                n = chunk_length(step, cfg, runner.exp.steps_per_call)
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
                    resume_hint(runner.workdir),
                )
                return {
                    "interrupted": True,
                    "step": step,
                    "signal": stop.signum,
                    "requeue": stop.requeue,
                }
        train_seconds = time.perf_counter() - start_time
        untimed = runner.compile_seconds + runner.pause_seconds
        unchanged = step > start_step and bool(all_equal(start_params, state.meta_params))
        if unchanged:
            log.warning(unchanged_warning(outer_step_settings(cfg.algorithm), start_step, step))
        del start_params
        with stop.at_once("the final validation"):
            best_score = _validate(runner, writer, state, best_score)
        with stop.at_once("the final test evaluation"):
            records = _final_evaluation(runner, state)
    finally:
        progress.close()
        writer.close()
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
        "task_batching": runner.exp.task_batching,
        "devices": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
        "best_val_score": _json_float(best_score),
        # false when this process's meta-steps left the meta-parameters exactly as they were
        "meta_params_changed": None if step == start_step else not unchanged,
        "eval": records,
        # data loading or preparation, compilation, training and evaluation, all together
        "wall_seconds": time.perf_counter() - started,
        "earlier_processes": earlier_processes(runner.workdir),
    }
    _write_json(runner.workdir, "summary.json", summary)
    return summary


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
    averaged = _average(pending)
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


def _why_none(store: str, otherwise: str) -> str:
    """Why a checkpoint store has no intact checkpoint: damaged ones moved to its
    ``damaged/`` (the restore's warning named each), or ``otherwise``."""
    damaged = os.path.join(store, DAMAGED)
    return f"damaged ones were moved to {damaged}" if os.path.isdir(damaged) else otherwise


def load_for_evaluation(cfg: Config, workdir: str, which: str = "best") -> tuple[Runner, Any]:
    """A runner and saved meta-parameters (``best`` or ``latest``) from a run directory, or the
    run's untrained initialisation (``init``, drawn from its seed; no checkpoint is read).

    Without an intact ``best/`` checkpoint, the latest one is loaded instead, with a warning.
    ``runner.loaded`` says which: ``"best"``, ``"latest"`` or ``"init"``, and
    ``runner.loaded_step`` (0 for ``init``). Any other ``which`` is a ValueError.
    """
    if which not in ("best", "latest", "init"):
        raise ValueError(f"which={which!r}: choose best, latest or init")
    runner = Runner(cfg, workdir)
    template = runner.initial_state
    if which == "init":
        runner.loaded, runner.loaded_step = "init", 0
        return runner, trained(template)
    if which == "best":
        best = runner.best.restore_intact(trained(template))
        if best is not None:
            runner.loaded, runner.loaded_step = "best", int(best[1]["step"])
            return runner, best[0]
        log.warning(
            "no intact best-on-validation checkpoint in %s (%s): the latest is used",
            runner.best.directory,
            _why_none(runner.best.directory, "validation off, or no validation yet"),
        )
    latest = runner.checkpoints.restore_intact(template)
    if latest is None:
        runner.close()
        why = _why_none(runner.checkpoints.directory, "none was saved")
        raise FileNotFoundError(
            f"no intact checkpoint in {runner.checkpoints.directory} ({why}): nothing to "
            f"evaluate; rerun the training command with hydra.run.dir={workdir} to train it "
            "again, or evaluate the untrained initialisation with --which init"
        )
    runner.loaded, runner.loaded_step = "latest", int(latest[0].step)
    return runner, trained(latest[0])
