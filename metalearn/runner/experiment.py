"""Build the parts of a run from its plan: task family, model, algorithm, optimiser, state."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from metalearn.algorithms.base import MetaLearner
from metalearn.config import OptimizerConfig
from metalearn.data.task import Objective, TaskFamily, family_objective
from metalearn.models.base import Model, ModelParts, model_from_flax
from metalearn.registry import ALGORITHMS, MODELS, TASKS
from metalearn.runner import preflight
from metalearn.runner.plan import RunPlan
from metalearn.runner.steps import (
    TrainState,
    init_train_state,
    make_meta_step,
    make_meta_train_step,
)

# Streams derived from the run's seed; evaluation uses its own seed (EvalConfig.seed).
TRAIN_STREAM, INIT_STREAM, MODEL_STREAM = 0, 1, 2


class Hyper(NamedTuple):
    """The values a run's compiled steps take as arguments, not constants, so that runs
    differing only in them (a sweep's usual axes) share one compiled program."""

    train_key: jax.Array  # tasks of step s: fold_in(train_key, s)
    model_key: jax.Array  # model randomness of step s: fold_in(model_key, s)
    learner: dict[str, jax.Array]  # MetaLearner.hyper, as float32 scalars
    lr: jax.Array  # float32 scalar: the outer learning rate (the peak of a schedule)


class Experiment(NamedTuple):
    """A run's parts, built from its :class:`~metalearn.runner.plan.RunPlan` by :func:`build`."""

    plan: RunPlan
    tasks: TaskFamily
    model: Model
    objective: Objective
    learner: MetaLearner
    optimizer: optax.GradientTransformationExtraArgs
    initial_state: TrainState
    hyper: Hyper  # the seed's keys and the rates, as the compiled steps take them

    def meta_train_step(self, meta_steps: int, mesh=None, hyper: Hyper | None = None):
        """This experiment's ``meta_train_step(state, tasks) -> (state, metrics)``; with
        ``hyper``, its keys and rates as given (traced arguments)."""
        return make_meta_train_step(
            self.learner,
            self.optimizer,
            meta_steps=meta_steps,
            strategy=self.plan.task_batching,
            key=(self.hyper if hyper is None else hyper).model_key,
            mesh=mesh,
            hyper=None if hyper is None else hyper.learner,
            learning_rate=None if hyper is None else hyper.lr,
        )

    def traced_meta_step(self, mesh=None):
        """``meta_step(state, train_arrays, hyper) -> (state, metrics)``: sample a meta-batch
        on the device and update, ``hyper``'s keys and rates traced; not yet jitted."""
        t = self.plan.config.trainer

        def meta_step(state: TrainState, train_arrays: Any, hyper: Hyper):
            step = make_meta_step(
                self.meta_train_step(t.meta_steps, mesh, hyper),
                self.tasks,
                train_key=hyper.train_key,
                meta_batch_size=t.meta_batch_size,
                shots=t.shots,
                mesh=mesh,
            )
            return step(state, train_arrays)

        return meta_step


def learning_rate(
    cfg: OptimizerConfig, meta_steps: int, lr: float | jax.Array | None = None
) -> float | jax.Array | optax.Schedule:
    """The outer learning rate or schedule: ``constant`` (optional linear warm-up),
    ``cosine`` (warm-up, then a decay to ``lr * final_lr_fraction`` at ``meta_steps``) or
    ``step`` (warm-up, then ``lr * step_factors[i]`` from meta-step ``step_boundaries[i]`` on).
    ``lr`` (default ``cfg.lr``) may be traced.

    >>> schedule = learning_rate(OptimizerConfig(schedule="cosine", final_lr_fraction=0.01), 100)
    >>> round(float(schedule(0)), 8), round(float(schedule(100)), 8)
    (0.001, 1e-05)
    >>> stepped = OptimizerConfig(schedule="step", step_boundaries=[2, 4], step_factors=[0.1, 0.01])
    >>> [round(float(learning_rate(stepped, 10)(k)), 8) for k in range(6)]
    [0.001, 0.001, 0.0001, 0.0001, 1e-05, 1e-05]
    """
    lr = cfg.lr if lr is None else lr
    if cfg.schedule == "step":
        boundaries = jnp.asarray(cfg.step_boundaries)
        factors = jnp.asarray([1.0, *cfg.step_factors], jnp.float32)
        warmup = max(cfg.warmup_steps, 1)

        def stepped(count):
            rate = lr * factors[jnp.searchsorted(boundaries, count, side="right")]
            return jnp.where(count < cfg.warmup_steps, rate * count / warmup, rate)

        return stepped
    if cfg.schedule == "cosine":
        # optax.warmup_cosine_decay_schedule, spelled out: it compares a traced rate with 0.
        decay_steps = max(meta_steps, cfg.warmup_steps + 1)
        return optax.join_schedules(
            [
                optax.linear_schedule(0.0 if cfg.warmup_steps else lr, lr, cfg.warmup_steps),
                optax.cosine_decay_schedule(
                    lr, decay_steps - cfg.warmup_steps, alpha=cfg.final_lr_fraction
                ),
            ],
            [cfg.warmup_steps],
        )
    if cfg.warmup_steps:
        return optax.linear_schedule(0.0, lr, cfg.warmup_steps)
    return lr


def build_optimizer(cfg: OptimizerConfig, meta_steps: int) -> optax.GradientTransformationExtraArgs:
    """The outer optimiser: adam | adamw | sgd (momentum, Nesterov's, weight decay) at
    :func:`learning_rate`, optional clipping (each entry by value, then by the global norm).

    Its rate is data, ``update(..., learning_rate=lr)`` (default ``cfg.lr``), and its state
    that of ``optax.adam(lr)`` (``adamw``, ``sgd``), so checkpoints of either restore into both.

    >>> import jax.numpy as jnp
    >>> optimizer = build_optimizer(OptimizerConfig(name="sgd", lr=0.1), 10)
    >>> params = {"w": jnp.ones(2)}
    >>> updates, _ = optimizer.update(params, optimizer.init(params), params, learning_rate=0.5)
    >>> updates["w"]
    Array([-0.5, -0.5], dtype=float32)
    """
    if cfg.name == "adam":
        statistics = [optax.scale_by_adam()]
    elif cfg.name == "adamw":
        statistics = [optax.scale_by_adam(), optax.add_decayed_weights(cfg.weight_decay)]
    else:  # weight decay as PyTorch's SGD adds it: to the gradient, before the momentum
        decay = [optax.add_decayed_weights(cfg.weight_decay)] if cfg.weight_decay else []
        momentum = optax.trace(decay=cfg.momentum, nesterov=cfg.nesterov)
        statistics = [*decay, momentum if cfg.momentum else optax.identity()]

    def at_rate(lr) -> optax.GradientTransformation:  # optax's own arithmetic, at this rate
        return optax.scale_by_learning_rate(learning_rate(cfg, meta_steps, lr))

    def update(updates, state, params=None, *, learning_rate=None, **extra_args):
        return at_rate(cfg.lr if learning_rate is None else learning_rate).update(updates, state)

    scaled = optax.GradientTransformationExtraArgs(at_rate(cfg.lr).init, update)
    clipping = [optax.clip(cfg.grad_clip_value)] if cfg.grad_clip_value > 0 else []
    if cfg.grad_clip_norm > 0:
        clipping.append(optax.clip_by_global_norm(cfg.grad_clip_norm))
    base = optax.chain(*statistics, scaled)
    return optax.chain(*clipping, base) if clipping else base


def build_model(model_config: Any, tasks: TaskFamily, data_name: str = "the data") -> Model:
    """The registered model ``model_config`` names, sized for ``tasks`` and checked."""
    module = MODELS.build(model_config, tasks.num_outputs)
    preflight.check_module(module, model_config.name, tasks, data_name)
    parts = MODELS.entry(model_config.name).info.get("parts", ModelParts())
    model = model_from_flax(module, tasks.input_shape, parts)
    preflight.check_parameters(model, model_config.name)
    return model


def build(plan: RunPlan, tasks: TaskFamily | None = None) -> Experiment:
    """Every part of the run ``plan`` describes, built once and checked as it is built.
    ``tasks``: a family built and checked already (a group's runs share theirs)."""
    cfg = plan.config
    preflight.check_settings(plan)
    shared, tasks = tasks, TASKS.build(cfg.data) if tasks is None else tasks
    model = build_model(cfg.model, tasks, cfg.data.name)
    objective = family_objective(tasks, model, f"data={cfg.data.name}")
    learner = ALGORITHMS.build(cfg.algorithm, objective)
    preflight.check_learner(learner, cfg.algorithm.name)
    if shared is None:
        preflight.check_family_and_objective(cfg, tasks, objective)
    optimizer = build_optimizer(cfg.optimizer, cfg.trainer.meta_steps)
    root = jax.random.key(cfg.seed)
    state = init_train_state(learner, model, optimizer, jax.random.fold_in(root, INIT_STREAM))
    hyper = Hyper(
        jax.random.fold_in(root, TRAIN_STREAM),
        jax.random.fold_in(root, MODEL_STREAM),
        {name: jnp.asarray(value, jnp.float32) for name, value in learner.hyper.items()},
        jnp.asarray(cfg.optimizer.lr, jnp.float32),
    )
    return Experiment(plan, tasks, model, objective, learner, optimizer, state, hyper)


def count_parameters(tree: Any) -> int:
    return sum(int(x.size) for x in jax.tree_util.tree_leaves(tree))
