"""One run's compiled programs and stores: :class:`Runner`, built from an experiment.

The training loop (:mod:`metalearn.runner.loop`) and ``metalearn.evaluate`` drive it: it
places the state and the data on the devices, compiles the fused training call and the
evaluation step once, saves and restores checkpoints (``checkpoints/``, ``best/``), and says
what to change when training produces a NaN.
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

from metalearn.runner.checkpoints import DAMAGED, CheckpointStore
from metalearn.runner.devices import replicated
from metalearn.runner.divergence import divergence_advice
from metalearn.runner.evaluation import evaluate_split
from metalearn.runner.experiment import Experiment
from metalearn.runner.rundir import RunDirectory
from metalearn.runner.steps import all_finite, make_eval_step, make_multi_step, trained

log = logging.getLogger("metalearn")

# Checkpoint metadata key: the step count and mean training metrics of the steps since the last
# log line, which the next log line averages in.
UNLOGGED = "unlogged_train_metrics"


class NonFiniteError(FloatingPointError):
    """Training produced a NaN or an infinity; nothing non-finite was saved."""


class Runner:
    """One run of ``exp`` in ``run_dir``: its compiled steps, its checkpoints, its evaluation.

    The constructor only builds: every check ran as the experiment was built
    (:func:`~metalearn.runner.experiment.build`).
    """

    def __init__(self, exp: Experiment, run_dir: RunDirectory):
        self.exp, self.plan, self.run_dir = exp, exp.plan, run_dir
        self.cfg, self.workdir, self.mesh = exp.plan.config, run_dir.path, exp.plan.mesh
        keep = self.cfg.trainer.keep_checkpoints
        self.checkpoints = CheckpointStore(
            os.path.join(self.workdir, "checkpoints"), keep, run_dir.primary
        )
        self.best = CheckpointStore(os.path.join(self.workdir, "best"), 1, run_dir.primary)
        self.initial_state = replicated(exp.initial_state, self.mesh)
        # A host copy: the first training call donates (deletes) the device buffers.
        self._initial_trained = jax.device_get(trained(exp.initial_state))
        self.splits = replicated(exp.tasks.splits, self.mesh)
        # The seed's keys and the rates are arguments of the compiled steps, not constants.
        self.hyper = replicated(exp.hyper, self.mesh)
        self._meta_step = exp.traced_meta_step(self.mesh)
        self._compiled: dict[int, Any] = {}
        self.loaded, self.loaded_step = "", -1  # what load() loaded
        self.compile_seconds = 0.0
        self.compile_steps = 0  # meta-steps run by compiling calls: their time is compile time
        self.pause_seconds = 0.0  # validation and checkpoint saves: with compiling, not in steps/s
        self.eval_step = make_eval_step(
            exp.learner,
            exp.tasks,
            steps=tuple(self.cfg.eval.steps),
            strategy=self.plan.task_batching,
            mesh=self.mesh,
        )

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

        def eval_step(params, arrays, keys, shots):
            keys = replicated(keys, self.mesh)
            return self.eval_step(params, arrays, keys, shots, self.hyper.learner)

        return evaluate_split(
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
        )

    def restore(self):
        """``(state, best score, unlogged training metrics)`` of the latest intact checkpoint,
        or of the initialisation (``trainer.resume=false``: always)."""
        state, best_score, unlogged = self.initial_state, -math.inf, []
        restored = self.checkpoints.restore_intact(state) if self.cfg.trainer.resume else None
        if restored is not None:
            state, metadata = restored
            if metadata.get("best_score") is not None:
                best_score = float(metadata["best_score"])
            if metadata.get(UNLOGGED):  # absent in checkpoints of older versions
                unlogged = [(int(metadata[UNLOGGED]["steps"]), dict(metadata[UNLOGGED]["mean"]))]
            log.info("resumed from step %d (%s)", int(state.step), self.checkpoints.directory)
        return state, best_score, unlogged

    def save(self, state, best_score: float, unlogged: Sequence[tuple[int, dict]] = ()) -> None:
        """Checkpoint ``state``, with the training metrics of the steps since the last log line
        (``unlogged``), so that a resumed run logs the same averages as an uninterrupted one.
        The run's record is written with its first checkpoint (:class:`RunDirectory`)."""
        step, started = int(state.step), time.perf_counter()
        if not bool(all_finite(state.meta_params)):
            raise self.non_finite(step, "parameters")
        metadata = {"step": step, "best_score": json_float(best_score)}
        if unlogged:
            metadata[UNLOGGED] = {"steps": sum(n for n, _ in unlogged), "mean": average(unlogged)}
        self.run_dir.record()
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
        advice = divergence_advice(self.exp, self.splits["train"], good)
        return NonFiniteError(
            f"non-finite {what} at step {step}; nothing non-finite was saved (last intact "
            f"checkpoint: {where}). Likely cause: {advice}; then rerun in the same run "
            "directory to resume from the last intact checkpoint."
        )

    def load(self, which: str = "best") -> Any:
        """Saved meta-parameters (``best`` or ``latest``), or the run's untrained initialisation
        (``init``, drawn from its seed; no checkpoint is read), for an evaluation.

        Without an intact ``best/`` checkpoint, the latest one is loaded instead, with a warning.
        ``self.loaded`` says which: ``"best"``, ``"latest"`` or ``"init"``, and
        ``self.loaded_step`` (0 for ``init``). Any other ``which`` is a ValueError.
        """
        if which not in ("best", "latest", "init"):
            raise ValueError(f"which={which!r}: choose best, latest or init")
        template = self.initial_state
        if which == "init":
            self.loaded, self.loaded_step = "init", 0
            return trained(template)
        if which == "best":
            best = self.best.restore_intact(trained(template))
            if best is not None:
                self.loaded, self.loaded_step = "best", int(best[1]["step"])
                return best[0]
            log.warning(
                "no intact best-on-validation checkpoint in %s (%s): the latest is used",
                self.best.directory,
                _why_none(self.best.directory, "validation off, or no validation yet"),
            )
        latest = self.checkpoints.restore_intact(template)
        if latest is None:
            self.close()
            why = _why_none(self.checkpoints.directory, "none was saved")
            raise FileNotFoundError(
                f"no intact checkpoint in {self.checkpoints.directory} ({why}): nothing to "
                f"evaluate; rerun the training command with hydra.run.dir={self.workdir} to "
                "train it again, or evaluate the untrained initialisation with --which init"
            )
        self.loaded, self.loaded_step = "latest", int(latest[0].step)
        return trained(latest[0])

    def close(self) -> None:
        self.checkpoints.close()
        self.best.close()


def json_float(x: float) -> float | None:
    return None if not math.isfinite(x) else float(x)


def average(pending: Sequence[tuple[int, dict]]) -> dict[str, float]:
    """Step-weighted mean of the metrics of the calls since the last log line."""
    total = sum(n for n, _ in pending)
    host = [(n, jax.device_get(m)) for n, m in pending]
    return {k: float(sum(n * float(m[k]) for n, m in host) / total) for k in host[0][1]}


def _why_none(store: str, otherwise: str) -> str:
    """Why a checkpoint store has no intact checkpoint: damaged ones moved to its
    ``damaged/`` (the restore's warning named each), or ``otherwise``."""
    damaged = os.path.join(store, DAMAGED)
    return f"damaged ones were moved to {damaged}" if os.path.isdir(damaged) else otherwise
