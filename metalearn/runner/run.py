"""Runs' compiled programs and stores (:class:`Runner`): device placement, the fused training
call and evaluation step, checkpoints, and advice on a NaN. Runs differing only in what the
step takes as data share one program, stacked on a leading runs axis; one run has no such axis.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from metalearn.runner.checkpoints import DAMAGED, CheckpointStore
from metalearn.runner.devices import replicated, runs_mesh
from metalearn.runner.divergence import divergence_advice
from metalearn.runner.evaluation import evaluate_split
from metalearn.runner.experiment import Experiment
from metalearn.runner.rundir import RunDirectory
from metalearn.runner.steps import (
    all_finite,
    make_eval_step,
    make_multi_step,
    run_of,
    stack,
    trained,
)
from metalearn.statistics import json_float

log = logging.getLogger("metalearn")

# Checkpoint metadata: the steps and mean training metrics since the last log line.
UNLOGGED = "unlogged_train_metrics"


class NonFiniteError(FloatingPointError):
    """Training produced a NaN or an infinity; nothing non-finite was saved."""


class Runner:
    """The runs of ``exps`` (one experiment, or a group sharing a program), each in its run
    directory of ``run_dirs``. With several runs, every state it takes or returns, and
    ``initial_state`` and ``hyper``, have a leading runs axis."""

    def __init__(
        self,
        exps: Experiment | Sequence[Experiment],
        run_dirs: RunDirectory | Sequence[RunDirectory],
    ):
        single = isinstance(exps, Experiment)
        self.exps = [exps] if single else list(exps)
        self.run_dirs = [run_dirs] if single else list(run_dirs)
        self.exp, self.workdir = self.exps[0], self.run_dirs[0].path
        self.plan, self.cfg = self.exp.plan, self.exp.plan.config
        self.count, self.vectorized = len(self.exps), not single
        # A group's runs are split across the devices, its tasks not.
        self.runs_mesh = runs_mesh(self.count) if self.vectorized else None
        self.mesh = None if self.vectorized else self.plan.mesh
        self.checkpoints = [
            CheckpointStore(
                os.path.join(d.path, "checkpoints"), d.config.trainer.keep_checkpoints, d.primary
            )
            for d in self.run_dirs
        ]
        self.best = [
            CheckpointStore(os.path.join(d.path, "best"), 1, d.primary) for d in self.run_dirs
        ]
        self.initial_state = self.placed([e.initial_state for e in self.exps])
        # A host copy: the first training call donates (deletes) the device buffers.
        self._initial_trained = jax.device_get(trained(self.initial_state))
        self.splits = replicated(self.exp.tasks.splits, self.mesh)
        self.hyper = self.placed([e.hyper for e in self.exps])
        self._meta_step = self.exp.traced_meta_step(self.mesh)
        self._compiled: dict[int, Any] = {}
        self.loaded, self.loaded_step = "", -1  # what load() loaded
        self.compile_seconds = self.pause_seconds = 0.0  # neither counts in steps/s
        self.compile_steps = 0  # meta-steps run by compiling calls
        self.eval_step = make_eval_step(
            self.exp.learner,
            self.exp.tasks,
            steps=tuple(self.cfg.eval.steps),
            strategy=self.plan.task_batching,
            mesh=self.mesh,
            runs=self.vectorized,
            runs_mesh=self.runs_mesh,
        )

    def placed(self, per_run: Sequence[Any]) -> Any:
        """The runs' pytrees as the compiled steps take them (stacked for a group)."""
        if not self.vectorized:
            return replicated(per_run[0], self.mesh)
        stacked = stack(list(per_run))
        if self.runs_mesh is None:
            return stacked
        return jax.device_put(stacked, NamedSharding(self.runs_mesh, PartitionSpec("runs")))

    def part(self, tree: Any, index: int) -> Any:
        """Run ``index``'s entry of a pytree the runner holds (stacked, or the one run's)."""
        return run_of(tree, index) if self.vectorized else tree

    def train_call(self, state, num_steps: int):
        """Run ``num_steps`` fused meta-steps. A new length is compiled, and its first call
        waited for (XLA finishes preparing on it), as compile time."""
        arrays = self.splits["train"]
        if num_steps in self._compiled:
            return self._compiled[num_steps](state, arrays, self.hyper)
        start = time.perf_counter()
        self._compiled[num_steps] = self.lower(state, num_steps).compile()
        if self.vectorized:
            check_fits(self._compiled[num_steps], self.count, device_memory_limit())
        result = jax.block_until_ready(self._compiled[num_steps](state, arrays, self.hyper))
        self.compile_seconds += time.perf_counter() - start
        self.compile_steps += num_steps
        log.info("compiled %d fused meta-step(s) in %.1f s", num_steps, time.perf_counter() - start)
        return result

    def is_compiled(self, num_steps: int) -> bool:
        return num_steps in self._compiled

    def lower(self, state, num_steps: int) -> jax.stages.Lowered:
        """The program of ``num_steps`` fused meta-steps from ``state``, lowered."""
        jitted = make_multi_step(self._meta_step, num_steps, self.runs_mesh, self.vectorized)
        return jitted.lower(state, self.splits["train"], self.hyper)

    def evaluate(
        self, trained_params, split: str, num_tasks: int, shots_list=None, on_chunk=None
    ) -> list[list[dict]]:
        """Each run's records of an evaluation of ``trained_params`` (stacked for a group)."""
        e = self.cfg.eval

        def eval_step(params, arrays, keys, shots):
            keys = replicated(keys, self.mesh)
            return self.eval_step(params, arrays, keys, shots, self.hyper.learner)

        records = evaluate_split(
            eval_step,
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
            runs=self.count if self.vectorized else None,
        )
        return records if self.vectorized else [records]

    def restore(self, start: int | None = None) -> tuple[Any, list[float], list]:
        """``(state, best scores, unlogged training metrics)`` of each run's latest intact
        checkpoint, or of step ``start`` (a group resuming together); 0 or no resume: the
        initialisation. A group's metrics are stacked, or none where the runs' differ."""
        states, best_scores, unlogged = [], [], []
        for i, store in enumerate(self.checkpoints):
            template = self.part(self.initial_state, i)
            if start == 0 or not self.cfg.trainer.resume:
                restored = None
            elif start is None:
                restored = store.restore_intact(template)
            else:
                restored = store.restore(template, start)
            state, best, pending = template, -math.inf, []
            if restored is not None:
                state, metadata = restored
                if metadata.get("best_score") is not None:
                    best = float(metadata["best_score"])
                if metadata.get(UNLOGGED):
                    saved = metadata[UNLOGGED]
                    pending = [(int(saved["steps"]), dict(saved["mean"]))]
                log.info("resumed from step %d (%s)", int(state.step), store.directory)
            states.append(state)
            best_scores.append(best)
            unlogged.append(pending)
        if not self.vectorized:
            return states[0], best_scores, unlogged[0]
        steps, pending = {u[0][0] if len(u) == 1 else None for u in unlogged}, []
        if len(steps) == 1 and None not in steps:
            keys = unlogged[0][0][1]
            pending = [(steps.pop(), {k: np.array([u[0][1][k] for u in unlogged]) for k in keys})]
        return self.placed(states), best_scores, pending

    def save(self, state, best_score: float, pending, i: int) -> None:
        """Checkpoint run ``i`` with its best score and the ``pending`` training metrics since
        the last log line, so that a resumed run logs the same averages. Non-finite parameters
        raise NonFiniteError, saving nothing."""
        started = time.perf_counter()
        part = self.part(state, i)
        step = int(part.step)
        if not bool(all_finite(part.meta_params)):
            raise self.non_finite(step, "parameters", i)
        metadata = {"step": step, "best_score": json_float(best_score)}
        if pending:
            own = [(n, self.part(metrics, i)) for n, metrics in pending]
            metadata[UNLOGGED] = {"steps": sum(n for n, _ in own), "mean": average(own)}
        self.run_dirs[i].record()
        self.checkpoints[i].save(step, part, metadata)
        self.pause_seconds += time.perf_counter() - started

    def non_finite(self, step: int, what: str, index: int = 0) -> NonFiniteError:
        """The error of run ``index`` producing a non-finite ``what`` at ``step``, with advice."""
        store, exp = self.checkpoints[index], self.exps[index]
        last = store.newest_intact_step()
        where = f"step {last} in {store.directory}" if last is not None else "none yet"
        good = self.part(self._initial_trained, index)
        if last is not None:
            with contextlib.suppress(RuntimeError):
                good = trained(store.restore(self.part(self.initial_state, index), last)[0])
        advice = divergence_advice(exp, replicated(exp.tasks.splits["train"], self.mesh), good)
        return NonFiniteError(
            f"non-finite {what} at step {step}; nothing non-finite was saved (last intact "
            f"checkpoint: {where}). Likely cause: {advice}; then rerun in the same run "
            "directory to resume from the last intact checkpoint."
        )

    def load(self, which: str = "best") -> Any:
        """The run's ``best`` or ``latest`` meta-parameters, or its untrained ``init``, for an
        evaluation; without an intact best, the latest (with a warning). ``self.loaded`` and
        ``self.loaded_step`` say which was loaded."""
        if which not in ("best", "latest", "init"):
            raise ValueError(f"which={which!r}: choose best, latest or init")
        template, best_store, store = self.initial_state, self.best[0], self.checkpoints[0]
        if which == "init":
            self.loaded, self.loaded_step = "init", 0
            return trained(template)
        if which == "best":
            best = best_store.restore_intact(trained(template))
            if best is not None:
                self.loaded, self.loaded_step = "best", int(best[1]["step"])
                return best[0]
            why = _why_none(best_store.directory, "validation off, or no validation yet")
            log.warning(
                f"no intact best-on-validation checkpoint in {best_store.directory} "
                f"({why}): the latest is used"
            )
        latest = store.restore_intact(template)
        if latest is None:
            self.close()
            why = _why_none(store.directory, "none was saved")
            raise FileNotFoundError(
                f"no intact checkpoint in {store.directory} ({why}): nothing to "
                f"evaluate; rerun the training command with hydra.run.dir={self.workdir} to "
                "train it again, or evaluate the untrained initialisation with --which init"
            )
        self.loaded, self.loaded_step = "latest", int(latest[0].step)
        return trained(latest[0])

    def close(self) -> None:
        for store in (*self.checkpoints, *self.best):
            store.close()


def device_memory_limit() -> int | None:
    """A device's memory in bytes, where the backend says (None on a CPU)."""
    stats = jax.devices()[0].memory_stats()
    return stats.get("bytes_limit") if stats else None


def check_fits(compiled: Any, runs: int, limit: int | None) -> None:
    """ValueError when the program of ``runs`` runs needs more device memory than ``limit``
    bytes (XLA's estimate), saying how many would fit.

    >>> class Program:
    ...     def memory_analysis(self):
    ...         return type("M", (), dict(argument_size_in_bytes=2**30, output_size_in_bytes=0,
    ...                                   alias_size_in_bytes=0, temp_size_in_bytes=7 * 2**30))
    >>> check_fits(Program(), 16, 6 * 2**30)
    Traceback (most recent call last):
    ...
    ValueError: a program of 16 runs needs 8.0 GiB of device memory, the device has 6.0 GiB: ...
    """
    analysis = compiled.memory_analysis()
    if limit is None or analysis is None:
        return
    needed = (
        analysis.argument_size_in_bytes
        + analysis.output_size_in_bytes
        - analysis.alias_size_in_bytes
        + analysis.temp_size_in_bytes
    )
    if needed <= limit:
        return
    fit = max(int(limit // (needed / runs)), 1)
    raise ValueError(
        f"a program of {runs} runs needs {_size(needed)} of device memory, the device has "
        f"{_size(limit)}: about {fit} run(s) fit; set hydra.launcher.max_runs_per_program={fit}"
    )


def _size(count: float) -> str:
    units = ((30, "GiB"), (20, "MiB"))
    power, unit = next(((p, u) for p, u in units if count >= 2**p), (10, "KiB"))
    return f"{count / 2**power:.1f} {unit}"


def average(pending: Sequence[tuple[int, dict]]) -> dict[str, Any]:
    """Step-weighted float64 mean of ``(steps, metrics)`` pairs (an array per run for a group)."""
    total = sum(n for n, _ in pending)
    host = [(n, jax.device_get(m)) for n, m in pending]
    means = {k: sum(n * np.asarray(m[k], np.float64) for n, m in host) / total for k in host[0][1]}
    return {k: float(v) if np.ndim(v) == 0 else v for k, v in means.items()}


def _why_none(store: str, otherwise: str) -> str:
    damaged = os.path.join(store, DAMAGED)
    return f"damaged ones were moved to {damaged}" if os.path.isdir(damaged) else otherwise
