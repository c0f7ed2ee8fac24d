"""Runs' compiled programs and stores: :class:`Runner`, built from one experiment or several.

The training loop (:mod:`metalearn.runner.loop`) and ``metalearn.evaluate`` drive it: it
places the states and the data on the devices, compiles the fused training call and the
evaluation step once, saves and restores checkpoints (``checkpoints/``, ``best/``), and says
what to change when training produces a NaN. Several runs that differ only in what the compiled
step takes as data (the seed, the rates) share one program: their states, keys and rates are
stacked on a leading runs axis (:func:`~metalearn.runner.steps.stack`), and each keeps its own
run directory. One run is the special case without that axis (today's program, bit for bit).
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

log = logging.getLogger("metalearn")

# Checkpoint metadata key: the step count and mean training metrics of the steps since the last
# log line, which the next log line averages in.
UNLOGGED = "unlogged_train_metrics"


class NonFiniteError(FloatingPointError):
    """Training produced a NaN or an infinity; nothing non-finite was saved."""


class Runner:
    """The runs of ``exps`` (one experiment, or several built from configs that differ only in
    data: :func:`~metalearn.runner.sweeps`' grouping), each in its run directory of
    ``run_dirs``: their compiled steps, their checkpoints, their evaluation.

    The constructor only builds: every check ran as the experiments were built
    (:func:`~metalearn.runner.experiment.build`). With several runs, ``initial_state``,
    ``hyper`` and every state the runner takes or returns have a leading runs axis.
    """

    def __init__(
        self,
        exps: Experiment | Sequence[Experiment],
        run_dirs: RunDirectory | Sequence[RunDirectory],
    ):
        single = isinstance(exps, Experiment)
        self.exps = [exps] if single else list(exps)
        self.run_dirs = [run_dirs] if single else list(run_dirs)
        self.exp, self.run_dir = self.exps[0], self.run_dirs[0]
        self.plan, self.cfg, self.workdir = self.exp.plan, self.exp.plan.config, self.run_dir.path
        self.count, self.vectorized = len(self.exps), not single
        # A group's runs are split across the devices (each steps its share), its tasks not.
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
        # The seed's keys and the rates are arguments of the compiled steps, not constants.
        self.hyper = self.placed([e.hyper for e in self.exps])
        self._meta_step = self.exp.traced_meta_step(self.mesh)
        self._compiled: dict[int, Any] = {}
        self.loaded, self.loaded_step = "", -1  # what load() loaded
        self.compile_seconds = 0.0
        self.compile_steps = 0  # meta-steps run by compiling calls: their time is compile time
        self.pause_seconds = 0.0  # validation and checkpoint saves: with compiling, not in steps/s
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
        """The runs' pytrees as the compiled steps take them: stacked on the runs axis (each
        device holding its runs), or the one run's, on every device of its task mesh."""
        if not self.vectorized:
            return replicated(per_run[0], self.mesh)
        stacked = stack(list(per_run))
        if self.runs_mesh is None:
            return stacked
        from jax.sharding import NamedSharding, PartitionSpec

        return jax.device_put(stacked, NamedSharding(self.runs_mesh, PartitionSpec("runs")))

    def part(self, tree: Any, index: int) -> Any:
        """Run ``index``'s entry of a pytree the runner holds (stacked, or the one run's)."""
        return run_of(tree, index) if self.vectorized else tree

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
        if self.vectorized:
            check_fits(self._compiled[num_steps], self.count, device_memory_limit())
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
        jitted = make_multi_step(self._meta_step, num_steps, self.runs_mesh, self.vectorized)
        return jitted.lower(state, self.splits["train"], self.hyper)

    def evaluate(
        self, trained_params, split: str, num_tasks: int, shots_list=None, on_chunk=None
    ) -> list[list[dict]]:
        """Each run's records of an evaluation of ``trained_params`` (a
        :class:`~metalearn.runner.steps.Trained`, stacked for several runs)."""
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

    def restore(self, start: int | None = None) -> tuple[Any, list[float], list[list]]:
        """``(state, best scores, unlogged training metrics)``: each run's latest intact
        checkpoint (``trainer.resume=false``: its initialisation), or with ``start``, its
        checkpoint of that step (the initialisation for 0), so that a group resumes together.
        """
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
                if metadata.get(UNLOGGED):  # absent in checkpoints of older versions
                    saved = metadata[UNLOGGED]
                    pending = [(int(saved["steps"]), dict(saved["mean"]))]
                log.info("resumed from step %d (%s)", int(state.step), store.directory)
            states.append(state)
            best_scores.append(best)
            unlogged.append(pending)
        return (self.placed(states) if self.vectorized else states[0]), best_scores, unlogged

    def saved_steps(self) -> list[int | None]:
        """Each run's newest intact checkpoint's step (None: none)."""
        return [store.newest_intact_step() for store in self.checkpoints]

    def save(self, state, best_scores, pending, runs: Sequence[int] | None = None) -> None:
        """Checkpoint each of ``runs`` (default: all) with its best score and the training
        metrics of the calls since the last log line (``pending``: ``(steps, metrics)`` pairs),
        so that a resumed run logs the same averages as an uninterrupted one. A run's record is
        written with its first checkpoint (:class:`RunDirectory`). A run with non-finite
        parameters is refused (NonFiniteError), saving nothing of it."""
        started = time.perf_counter()
        for i in range(self.count) if runs is None else runs:
            part = self.part(state, i)
            step = int(part.step)
            if not bool(all_finite(part.meta_params)):
                raise self.non_finite(step, "parameters", i)
            metadata = {"step": step, "best_score": json_float(best_scores[i])}
            if pending:
                own = [(n, self.part(metrics, i)) for n, metrics in pending]
                metadata[UNLOGGED] = {"steps": sum(n for n, _ in own), "mean": average(own)}
            self.run_dirs[i].record()
            self.checkpoints[i].save(step, part, metadata)
        self.pause_seconds += time.perf_counter() - started

    def pending(self, unlogged: list[list]) -> list:
        """The restored training metrics of the runs since their last log line, as the loop
        keeps them (stacked on the runs axis for a group); none where the runs' differ."""
        if not self.vectorized:
            return unlogged[0]
        if any(len(u) != 1 or u[0][0] != unlogged[0][0][0] for u in unlogged if u) or not all(
            unlogged
        ):
            return []
        keys = unlogged[0][0][1]
        return [(unlogged[0][0][0], {k: np.array([u[0][1][k] for u in unlogged]) for k in keys})]

    def non_finite(self, step: int, what: str, index: int = 0) -> NonFiniteError:
        """The error of run ``index`` producing a non-finite ``what`` at ``step``, with what to
        change (:func:`~metalearn.runner.divergence.divergence_advice`)."""
        store, exp = self.checkpoints[index], self.exps[index]
        last = store.newest_intact_step()
        where = f"step {last} in {store.directory}" if last is not None else "none yet"
        good = self.part(self._initial_trained, index)
        if last is not None:
            # Unloadable after all: the probe starts from the initial parameters.
            with contextlib.suppress(RuntimeError):
                good = trained(store.restore(self.part(self.initial_state, index), last)[0])
        advice = divergence_advice(exp, replicated(exp.tasks.splits["train"], self.mesh), good)
        return NonFiniteError(
            f"non-finite {what} at step {step}; nothing non-finite was saved (last intact "
            f"checkpoint: {where}). Likely cause: {advice}; then rerun in the same run "
            "directory to resume from the last intact checkpoint."
        )

    def load(self, which: str = "best") -> Any:
        """The run's saved meta-parameters (``best`` or ``latest``), or its untrained
        initialisation (``init``, drawn from its seed; no checkpoint is read), for an
        evaluation.

        Without an intact ``best/`` checkpoint, the latest one is loaded instead, with a warning.
        ``self.loaded`` says which: ``"best"``, ``"latest"`` or ``"init"``, and
        ``self.loaded_step`` (0 for ``init``). Any other ``which`` is a ValueError.
        """
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
            log.warning(
                "no intact best-on-validation checkpoint in %s (%s): the latest is used",
                best_store.directory,
                _why_none(best_store.directory, "validation off, or no validation yet"),
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
    """The memory (bytes) of a device this process computes on, where the backend says (GPUs,
    TPUs); None otherwise (a CPU)."""
    stats = jax.devices()[0].memory_stats()
    return stats.get("bytes_limit") if stats else None


def check_fits(compiled: Any, runs: int, limit: int | None) -> None:
    """ValueError (one line) when the program of a group of ``runs`` runs needs more device
    memory than ``limit`` bytes (XLA's estimate: arguments, outputs, temporaries), saying how
    many runs would fit; nothing when the limit is unknown.

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
    """A number of bytes, in GiB, MiB or KiB."""
    unit = next((u for u in ("GiB", "MiB") if count >= 2 ** {"GiB": 30, "MiB": 20}[u]), "KiB")
    return f"{count / 2 ** {'GiB': 30, 'MiB': 20, 'KiB': 10}[unit]:.1f} {unit}"


def json_float(x: float) -> float | None:
    return None if not math.isfinite(x) else float(x)


def average(pending: Sequence[tuple[int, dict]]) -> dict[str, Any]:
    """Step-weighted mean (in float64) of the metrics of the calls since the last log line: a
    float each, or for a group (metrics with a leading runs axis) an array of one per run."""
    total = sum(n for n, _ in pending)
    host = [(n, jax.device_get(m)) for n, m in pending]
    means = {k: sum(n * np.asarray(m[k], np.float64) for n, m in host) / total for k in host[0][1]}
    return {k: float(v) if np.ndim(v) == 0 else v for k, v in means.items()}


def _why_none(store: str, otherwise: str) -> str:
    """Why a checkpoint store has no intact checkpoint: damaged ones moved to its
    ``damaged/`` (the restore's warning named each), or ``otherwise``."""
    damaged = os.path.join(store, DAMAGED)
    return f"damaged ones were moved to {damaged}" if os.path.isdir(damaged) else otherwise
