"""The training loop: jitted meta-steps, periodic evaluation, checkpoints, final evaluation."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import Any

import jax

from metalearn.config import Config
from metalearn.runner.checkpoints import CheckpointStore
from metalearn.runner.devices import is_primary_host, replicated, task_mesh
from metalearn.runner.evaluation import evaluate_split, format_record, selection_score
from metalearn.runner.experiment import Experiment, build_experiment, count_parameters
from metalearn.runner.reporting import MetricsWriter, Progress
from metalearn.runner.signals import StopRequest
from metalearn.runner.steps import (
    all_finite,
    make_eval_step,
    make_meta_step,
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
        self.checkpoints = CheckpointStore(
            os.path.join(workdir, "checkpoints"), cfg.trainer.keep_checkpoints
        )
        self.best = CheckpointStore(os.path.join(workdir, "best"), 1)
        self.mesh = task_mesh(cfg.trainer.shard_tasks, cfg.trainer.meta_batch_size)
        self.initial_state = replicated(self.exp.initial_state, self.mesh)
        self.splits = replicated(self.exp.tasks.splits, self.mesh)
        meta_step = make_meta_step(
            self.exp.meta_train_step(cfg.trainer.meta_steps, self.mesh),
            self.exp.tasks,
            train_key=self.exp.train_key,
            meta_batch_size=cfg.trainer.meta_batch_size,
            shots=cfg.trainer.shots,
            mesh=self.mesh,
        )
        self._meta_step = meta_step
        self._compiled: dict[int, Any] = {}
        self.compile_seconds = 0.0
        self._eval_step = make_eval_step(
            self.exp.learner,
            self.exp.tasks,
            steps=tuple(cfg.eval.steps),
            strategy=self.exp.task_batching,
            mesh=self.mesh,
        )

    def eval_step(self, trained_params, split_arrays, keys, shots: int):
        """The jitted evaluation of the tasks drawn from ``keys`` (placed on every device)."""
        return self._eval_step(trained_params, split_arrays, replicated(keys, self.mesh), shots)

    def train_call(self, state, num_steps: int):
        """Run ``num_steps`` fused meta-steps; compiles (timed) on first use of a length."""
        arrays = self.splits["train"]
        if num_steps not in self._compiled:
            start = time.perf_counter()
            jitted = make_multi_step(self._meta_step, num_steps)
            self._compiled[num_steps] = jitted.lower(state, arrays).compile()
            self.compile_seconds += time.perf_counter() - start
            log.info(
                "compiled %d fused meta-step(s) in %.1f s", num_steps, time.perf_counter() - start
            )
        return self._compiled[num_steps](state, arrays)

    def evaluate(self, trained_params, split: str, num_tasks: int, shots_list=None) -> list[dict]:
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
        )

    def save(self, state, best_score: float) -> None:
        step = int(state.step)
        if not bool(all_finite(state.meta_params)):
            raise self.non_finite(step, "parameters")
        self.checkpoints.save(step, state, {"step": step, "best_score": _json_float(best_score)})

    def non_finite(self, step: int, what: str) -> NonFiniteError:
        last = self.checkpoints.latest_step()
        where = f"step {last} in {self.checkpoints.directory}" if last is not None else "none yet"
        return NonFiniteError(
            f"non-finite {what} at step {step}; nothing non-finite was saved (last good "
            f"checkpoint: {where}). Lower optimizer.lr or set optimizer.grad_clip_norm, then rerun "
            f"in the same run directory to resume from it."
        )

    def close(self) -> None:
        self.checkpoints.close()
        self.best.close()


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
    stopped the run (a checkpoint was saved first).
    """
    started = time.perf_counter()  # before the data are loaded (and prepared, on a first run)
    os.makedirs(workdir, exist_ok=True)
    runner = Runner(cfg, workdir)
    try:
        return _train(runner, started)
    finally:
        runner.close()


def _restore(runner: Runner):
    state, best_score = runner.initial_state, -math.inf
    if runner.cfg.trainer.resume and runner.checkpoints.latest_step() is not None:
        state, metadata = runner.checkpoints.restore(state)
        if metadata.get("best_score") is not None:
            best_score = float(metadata["best_score"])
        log.info("resumed from step %d (%s)", int(state.step), runner.checkpoints.directory)
    return state, best_score


def _train(runner: Runner, started: float) -> dict:
    cfg, t = runner.cfg, runner.cfg.trainer
    state, best_score = _restore(runner)
    step = start_step = int(state.step)
    log.info(
        "training %s: %s on %s, %d parameters, tasks batched by %s, %d %s device(s)",
        cfg.name,
        cfg.algorithm.name,
        cfg.data.name,
        count_parameters(state.meta_params),
        runner.exp.task_batching,
        jax.device_count(),
        jax.devices()[0].platform,
    )
    writer = MetricsWriter(runner.workdir, resume_step=step, enabled=is_primary_host())
    progress = Progress(t.meta_steps, step, t.progress_bar)
    start_time, pending = time.perf_counter(), []
    try:
        with StopRequest() as stop:
            while step < t.meta_steps and not stop.requested:
                n = chunk_length(step, cfg, runner.exp.steps_per_call)
                state, metrics = runner.train_call(state, n)
                step += n
                progress.advance(step)
                pending.append((n, metrics))
                if step % t.log_every == 0 or step == t.meta_steps:
                    _log_training(runner, writer, progress, step, pending)
                    pending = []
                if t.eval_every and step % t.eval_every == 0 and step < t.meta_steps:
                    best_score = _validate(runner, writer, state, best_score)
                if step % t.checkpoint_every == 0 or step == t.meta_steps:
                    runner.save(state, best_score)
            if stop.requested:  # the signal may land after the last check inside the loop
                runner.save(state, best_score)
                log.warning(
                    "stopped at step %d; checkpoint saved in %s; rerun with "
                    "hydra.run.dir=%s to resume",
                    step,
                    runner.checkpoints.directory,
                    runner.workdir,
                )
                return {"interrupted": True, "step": step, "signal": stop.signum}
        train_seconds = time.perf_counter() - start_time
        best_score = _validate(runner, writer, state, best_score)
        records = _final_evaluation(runner, state)
    finally:
        progress.close()
        writer.close()
    summary = {
        "interrupted": False,
        "step": step,
        "train_seconds": train_seconds,
        "compile_seconds": runner.compile_seconds,
        "steps_per_s": (step - start_step) / max(train_seconds - runner.compile_seconds, 1e-9),
        "task_batching": runner.exp.task_batching,
        "devices": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
        "best_val_score": _json_float(best_score),
        "eval": records,
        # data loading or preparation, compilation, training and evaluation, all together
        "wall_seconds": time.perf_counter() - started,
    }
    _write_json(runner.workdir, "summary.json", summary)
    return summary


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
    rate = progress.update(step, averaged)
    writer.write(
        {
            "step": step,
            "split": "train",
            "steps_per_s": rate,
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
    cfg = runner.cfg
    records = runner.evaluate(trained(state), "val", cfg.eval.val_tasks, [cfg.trainer.shots])
    step = int(state.step)
    writer.write({"step": step, "split": "val", "eval": records})
    score = selection_score(records, runner.exp.objective, cfg.trainer.shots)
    if score > best_score:
        best_score = score
        runner.best.save(step, trained(state), {"step": step, "score": score})
    return best_score


def _final_evaluation(runner: Runner, state) -> list[dict]:
    cfg = runner.cfg
    meta_params, chosen = trained(state), "final"
    if cfg.eval.select_best and runner.best.latest_step() is not None:
        meta_params, metadata = runner.best.restore(trained(state))
        chosen = f"best on validation (step {metadata['step']})"
    log.info("final evaluation on %d test tasks with the %s parameters", cfg.eval.num_tasks, chosen)
    records = runner.evaluate(meta_params, "test", cfg.eval.num_tasks)
    _write_json(runner.workdir, "eval.json", records)
    for r in records:
        log.info("test %s", format_record(r))
    return records


def load_for_evaluation(cfg: Config, workdir: str, which: str = "best") -> tuple[Runner, Any]:
    """A runner and saved meta-parameters (``best`` or ``latest``) from a run directory."""
    runner = Runner(cfg, workdir)
    template = runner.initial_state
    if which == "best" and runner.best.latest_step() is not None:
        params, _ = runner.best.restore(trained(template))
        return runner, params
    if runner.checkpoints.latest_step() is None:
        runner.close()
        raise FileNotFoundError(f"no checkpoint in {workdir}: nothing to evaluate")
    state, _ = runner.checkpoints.restore(template)
    return runner, trained(state)
