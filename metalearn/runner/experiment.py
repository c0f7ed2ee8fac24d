"""Build the parts of a run from a validated config: task family, model, algorithm, optimiser."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from metalearn.algorithms.base import MetaLearner, check_batch_update
from metalearn.config import Config, OptimizerConfig
from metalearn.data.task import Objective, TaskFamily, family_objective
from metalearn.models.base import Model, ModelParts, model_from_flax, module_problem
from metalearn.registry import ALGORITHMS, MODELS, TASKS
from metalearn.rl.family import RLObjective
from metalearn.runner.cpu_backend import auto_cpu_devices, inline_solve_batch, usable_cores
from metalearn.runner.steps import (
    TrainState,
    init_train_state,
    make_meta_step,
    make_meta_train_step,
    resolve_steps_per_call,
    resolve_task_batching,
)

# Streams derived from the run's seed; evaluation uses its own seed (EvalConfig.seed).
TRAIN_STREAM, INIT_STREAM, MODEL_STREAM = 0, 1, 2


class Hyper(NamedTuple):
    """The values of a run that its compiled steps take as arguments rather than constants,
    so that runs differing only in them (the seed, the algorithm's hyperparameters such as
    ``algorithm.inner_lr``, ``optimizer.lr``: a sweep's usual axes) share one compiled program
    (and JAX's persistent compilation cache).
    """

    train_key: jax.Array  # tasks of step s: fold_in(train_key, s)
    model_key: jax.Array  # model randomness of step s: fold_in(model_key, s)
    learner: dict[str, jax.Array]  # MetaLearner.hyper, as float32 scalars
    lr: jax.Array  # float32 scalar: the outer learning rate (the peak of a schedule)


class Experiment(NamedTuple):
    tasks: TaskFamily
    model: Model
    objective: Objective
    learner: MetaLearner
    optimizer: optax.GradientTransformation
    task_batching: str
    steps_per_call: int
    initial_state: TrainState
    train_key: jax.Array  # tasks of step s: fold_in(train_key, s)
    model_key: jax.Array  # model randomness of step s: fold_in(model_key, s)
    hyper: Hyper  # the keys and rates above, as the compiled steps take them

    def meta_train_step(self, meta_steps: int, mesh=None):
        """This experiment's ``meta_train_step(state, tasks) -> (state, metrics)``."""
        return make_meta_train_step(
            self.learner,
            self.optimizer,
            meta_steps=meta_steps,
            strategy=self.task_batching,
            key=self.model_key,
            mesh=mesh,
        )

    def traced_meta_step(self, *, meta_steps: int, meta_batch_size: int, shots: int, mesh=None):
        """``meta_step(state, train_arrays, hyper) -> (state, metrics)``: sample a meta-batch
        on the device and update, with the keys and rates of ``hyper`` (a :class:`Hyper`, e.g.
        ``self.hyper``) traced arguments, not constants; not yet jitted."""

        def meta_step(state: TrainState, train_arrays: Any, hyper: Hyper):
            train_step = make_meta_train_step(
                self.learner,
                self.optimizer,
                meta_steps=meta_steps,
                strategy=self.task_batching,
                key=hyper.model_key,
                mesh=mesh,
                hyper=hyper.learner,
                learning_rate=hyper.lr,
            )
            step = make_meta_step(
                train_step,
                self.tasks,
                train_key=hyper.train_key,
                meta_batch_size=meta_batch_size,
                shots=shots,
                mesh=mesh,
            )
            return step(state, train_arrays)

        return meta_step


def learning_rate(
    cfg: OptimizerConfig, meta_steps: int, lr: float | jax.Array | None = None
) -> float | jax.Array | optax.Schedule:
    """The outer learning rate or schedule: the one home of the outer schedule.

    ``constant`` (with an optional linear warm-up) or ``cosine`` (warm-up, then a cosine decay
    to ``lr * final_lr_fraction`` at ``meta_steps``). An algorithm may recommend a schedule in
    its config group (``conf/algorithm/mamlpp.yaml``); the experiment's ``optimizer`` decides.
    ``lr`` (default ``cfg.lr``) may be a traced value (an argument of the compiled step: the
    optimizer's update takes it, :func:`build_optimizer`).

    >>> schedule = learning_rate(OptimizerConfig(schedule="cosine", final_lr_fraction=0.01), 100)
    >>> round(float(schedule(0)), 8), round(float(schedule(100)), 8)
    (0.001, 1e-05)
    """
    lr = cfg.lr if lr is None else lr
    if cfg.schedule == "cosine":
        # optax.warmup_cosine_decay_schedule, spelled out: it compares peak_value with 0 in
        # Python, which a traced rate cannot answer. Same arithmetic, same values.
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
    """The outer optimiser: adam | adamw | sgd at :func:`learning_rate`, optional clipping.

    Built once; its rate is data: ``update(..., learning_rate=lr)`` takes the run's
    ``optimizer.lr`` (``Hyper.lr``, an argument of the compiled step; ``cfg.lr`` when not
    given), as ``optax.inject_hyperparams`` would keep it in the state. The state is that of
    ``optax.adam(lr)`` (``adamw``, ``sgd``), so checkpoints of either restore into the other.

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
    else:
        statistics = [optax.trace(decay=cfg.momentum) if cfg.momentum else optax.identity()]

    def at_rate(lr) -> optax.GradientTransformation:  # optax's own arithmetic, at this rate
        return optax.scale_by_learning_rate(learning_rate(cfg, meta_steps, lr))

    def update(updates, state, params=None, *, learning_rate=None, **extra_args):
        return at_rate(cfg.lr if learning_rate is None else learning_rate).update(updates, state)

    scaled = optax.GradientTransformationExtraArgs(at_rate(cfg.lr).init, update)
    base = optax.chain(*statistics, scaled)
    if cfg.grad_clip_norm > 0:
        return optax.chain(optax.clip_by_global_norm(cfg.grad_clip_norm), base)
    return base


def build_model(model_config: Any, tasks: TaskFamily, data_name: str = "the data") -> Model:
    """The registered model ``model_config`` names, sized for ``tasks``, with the parts its
    registration declares (:class:`~metalearn.models.base.ModelParts`).

    A model that needs images (``input_rank = 3``) on other inputs is refused in one line.
    """
    module = MODELS.build(model_config, tasks.num_outputs)
    problem = module_problem(module)
    if problem:  # an AttributeError ("'function' object has no attribute 'init'") before
        raise ValueError(
            f"model={model_config.name}: its factory returned {problem}; see docs/extending.md "
            "(a model)"
        )
    rank = getattr(module, "input_rank", None)
    if rank == 3 and len(tasks.input_shape) != 3:
        advice = (  # a family with an objective of its own (RL's) needs its own kind of model
            "model=mlp, or an image dataset (data=omniglot, miniimagenet, cifarfs or fc100)"
            if tasks.objective is None
            else "a model for vector inputs (for an RL task family: model=gaussian_mlp)"
        )
        raise ValueError(
            f"model={model_config.name} needs images (inputs [height, width, channels]) but "
            f"data={data_name} gives inputs of shape {tuple(tasks.input_shape)}; use {advice}"
        )
    parts = MODELS.entry(model_config.name).info.get("parts", ModelParts())
    model = model_from_flax(module, tasks.input_shape, parts)
    check_parameters(model, model_config.name)
    return model


def check_parameters(model: Model, name: str) -> None:
    """ValueError (one line) if ``model`` has no parameters (nothing to meta-learn: the run
    trained nothing, silently) or its declared head is not one of its top-level parameter
    entries (a KeyError in the algorithms that adapt or replace the head). Traced only.

    >>> from metalearn.models.mlp import MLP
    >>> check_parameters(model_from_flax(MLP((8,), 1), (1,), ModelParts(head="out")), "mine")
    Traceback (most recent call last):
    ...
    ValueError: model=mine declares its head 'out' (ModelParts(head=...)), but its top-level ...
    """
    params, _ = jax.eval_shape(model.init, jax.random.key(0))
    if not jax.tree_util.tree_leaves(params):
        raise ValueError(
            f"model={name} has no parameters (its init returns none under 'params'): there is "
            "nothing to meta-learn; give it layers with parameters (nn.Dense, nn.Conv, ...)"
        )
    missing = [h for h in model.head if h not in params]
    if missing:
        raise ValueError(
            f"model={name} declares its head {missing[0]!r} (ModelParts(head=...)), but its "
            f"top-level parameter entries are {', '.join(sorted(params))}: name its final "
            f"layer {missing[0]!r} (nn.Dense(..., name={missing[0]!r})) or declare the name it has"
        )


def cpu_devices_for(cfg: Config, cores: int | None = None) -> int:
    """XLA:CPU devices a run asks for before JAX starts: one per core for a convolutional
    model under ``trainer.task_batching: auto`` (see
    :func:`~metalearn.runner.devices.auto_cpu_devices`), else one. ``task_batching: map``
    (or ``trainer.shard_tasks: false``) keeps one device looping over all the tasks.

    >>> from metalearn.config import TrainerConfig
    >>> from metalearn.models.conv4 import Conv4Config
    >>> cfg = Config(model=Conv4Config(), trainer=TrainerConfig(meta_batch_size=32))
    >>> cpu_devices_for(cfg, cores=2)
    2
    """
    t = cfg.trainer
    if t.task_batching != "auto" or not t.shard_tasks or cfg.distributed.enabled:
        return 1
    parts = MODELS.entry(cfg.model.name).info.get("parts", ModelParts())
    count = usable_cores() if cores is None else cores
    return auto_cpu_devices(parts.convolutional, t.meta_batch_size, count)


def needs_serial_lapack(cfg: Config) -> bool:
    """Whether a run's programs make batched LAPACK calls on CPU, so that it must ask for
    :func:`~metalearn.runner.cpu_backend.schedule_lapack_calls_serially` before JAX starts: an
    RL environment registered with a ``linalg_size`` (the locomotion families).

    >>> from metalearn.rl.family import RLTasksConfig
    >>> [needs_serial_lapack(Config(data=RLTasksConfig(env=e))) for e in ("nav2d", "ant_dir")]
    [False, True]
    """
    from metalearn.rl.envs import BATCHED_LINALG_ENVS

    return getattr(cfg.data, "env", None) in BATCHED_LINALG_ENVS


def _linalg_size_on_cpu_devices(cfg: Config, platform: str, device_count: int) -> int | None:
    """The size of the systems a locomotion family's physics solves in batches
    (:data:`~metalearn.rl.envs.BATCHED_LINALG_ENVS`) when the run has several XLA:CPU devices;
    None for any other run."""
    from metalearn.rl.envs import BATCHED_LINALG_ENVS

    if platform != "cpu" or device_count < 2:
        return None
    return BATCHED_LINALG_ENVS.get(getattr(cfg.data, "env", None))


def lapack_batch_error(cfg: Config, strategy: str, platform: str, device_count: int) -> str | None:
    """The line a run is refused with when, on several XLA:CPU devices, one device would step
    so many rollouts of a locomotion family at once that its physics' batched solve takes
    jaxlib 0.10's threaded path, which deadlocks across devices (every thread idle, the run
    hung; :func:`~metalearn.runner.cpu_backend.inline_solve_batch`). Training's outer step
    runs ``vmap`` over each device's tasks; evaluation batches them as ``strategy`` says.
    None when the run is safe from it (one device, tasks not sharded, another family).

    >>> from metalearn.config import TrainerConfig
    >>> from metalearn.rl.algorithm import MAMLRLAlgorithmConfig
    >>> from metalearn.rl.family import RLTasksConfig
    >>> def error(env, rollouts, devices):
    ...     cfg = Config(data=RLTasksConfig(env=env, rollouts=rollouts),
    ...                  algorithm=MAMLRLAlgorithmConfig(post_rollouts=rollouts),
    ...                  trainer=TrainerConfig(meta_batch_size=10))
    ...     return lapack_batch_error(cfg, "map", "cpu", devices)
    >>> print(error("ant_dir", 20, 2))  # doctest: +ELLIPSIS
    ant_dir on 2 XLA:CPU devices: each would step 100 rollouts at once (5 tasks x 20), ...
    >>> error("ant_dir", 14, 2), error("ant_dir", 20, 1), error("cheetah_dir", 20, 2)
    (None, None, None)
    """
    size = _linalg_size_on_cpu_devices(cfg, platform, device_count)
    if size is None or not cfg.trainer.shard_tasks:
        return None
    limit = inline_solve_batch(size)
    tasks = cfg.trainer.meta_batch_size // device_count
    rollouts = max(cfg.data.rollouts, getattr(cfg.algorithm, "post_rollouts", 0))
    what, batch = f"{tasks} tasks x {rollouts}", tasks * rollouts
    eval_tasks = 1 if strategy != "vmap" else -(-cfg.eval.tasks_per_call // device_count)
    eval_rollouts = getattr(cfg.algorithm, "eval_rollouts", 0)
    if eval_tasks * eval_rollouts > batch:
        what = f"{eval_tasks} evaluation tasks x {eval_rollouts}"
        batch = eval_tasks * eval_rollouts
    if batch <= limit:
        return None
    return (
        f"{cfg.data.env} on {device_count} XLA:CPU devices: each would step {batch} rollouts "
        f"at once ({what}), solving {batch} {size} x {size} systems in one batched LAPACK call, "
        f"which jaxlib 0.10 splits across threads and which deadlocks across devices (at most "
        f"{limit} run inline); run on one device (unset JAX_NUM_CPU_DEVICES) or lower "
        "trainer.meta_batch_size or the rollouts per task"
    )


def lapack_device_warning(cfg: Config, platform: str, device_count: int) -> str | None:
    """The line a run logs when it shards a locomotion family's physics over several XLA:CPU
    devices (``JAX_NUM_CPU_DEVICES``): serial LAPACK scheduling orders the calls within one
    device, not across devices, so two devices' batched Cholesky solves can still deadlock
    (experiments/rl/locomotion/README.md). None for any other run.

    >>> from metalearn.rl.family import RLTasksConfig
    >>> def warning(env, devices):
    ...     return lapack_device_warning(Config(data=RLTasksConfig(env=env)), "cpu", devices)
    >>> warning("cheetah_dir", 2).startswith("2 XLA:CPU devices on cheetah_dir: ")
    True
    >>> warning("cheetah_dir", 1), warning("nav2d", 2)
    (None, None)
    """
    if _linalg_size_on_cpu_devices(cfg, platform, device_count) is None:
        return None
    return (
        f"{device_count} XLA:CPU devices on {cfg.data.env}: jaxlib 0.10's batched LAPACK calls "
        "(the physics' Cholesky) can deadlock across devices on large batches; if the run "
        "stops making progress, stop it and resume with one device (unset JAX_NUM_CPU_DEVICES)"
    )


def unread_final_lr_warning(cfg: OptimizerConfig) -> str | None:
    """The line a run logs when ``final_lr_fraction`` is set and no schedule reads it.

    Only ``schedule=cosine`` decays to ``lr * final_lr_fraction``. A warning, not a refusal:
    ``algorithm=mamlpp`` recommends ``final_lr_fraction=0.01`` with its cosine, and
    ``optimizer.schedule=constant`` alone should still turn the cosine off.

    >>> unread_final_lr_warning(OptimizerConfig(final_lr_fraction=0.01))[:64]
    'optimizer.final_lr_fraction=0.01 is unused: only optimizer.sched'
    >>> unread_final_lr_warning(OptimizerConfig(schedule="cosine", final_lr_fraction=0.01))
    """
    if cfg.schedule == "cosine" or cfg.final_lr_fraction == 0:
        return None
    return (
        f"optimizer.final_lr_fraction={cfg.final_lr_fraction} is unused: only "
        f"optimizer.schedule=cosine decays the rate, and this run's schedule is {cfg.schedule} "
        f"(the rate {'warms up to' if cfg.warmup_steps else 'stays'} {cfg.lr}); for a decay, "
        "set optimizer.schedule=cosine"
    )


def outer_step_settings(algorithm_config: Any) -> str | None:
    """What sets the algorithm's outer step when the ``optimizer`` section does not (None)."""
    declared = ALGORITHMS.entry(algorithm_config.name).info.get("outer_step_settings")
    return declared(algorithm_config) if declared else None


def refuse_unused_optimizer(cfg: Config) -> None:
    """ValueError if ``optimizer.*`` is set away from its defaults where nothing reads it."""
    settings = outer_step_settings(cfg.algorithm)
    if settings is None:
        return
    default = OptimizerConfig()
    changed = [
        f"optimizer.{f.name}={getattr(cfg.optimizer, f.name)}"
        for f in dataclasses.fields(OptimizerConfig)
        if getattr(cfg.optimizer, f.name) != getattr(default, f.name)
    ]
    if changed:
        raise ValueError(
            f"{', '.join(changed)} would have no effect: algorithm={cfg.algorithm.name} takes "
            f"its outer step with {settings}, not the optimizer section; drop the setting"
        )


def build_experiment(cfg: Config) -> Experiment:
    """Everything a run needs, from a config already checked by :func:`config.validate`."""
    refuse_unused_optimizer(cfg)
    tasks = TASKS.build(cfg.data)
    model = build_model(cfg.model, tasks, cfg.data.name)
    objective = family_objective(tasks, model, f"data={cfg.data.name}")
    learner = ALGORITHMS.build(cfg.algorithm, objective)
    if not isinstance(learner, MetaLearner):  # None: an AttributeError traceback, later
        raise ValueError(
            f"algorithm={cfg.algorithm.name}: its factory returned {type(learner).__name__}, "
            "not a metalearn.algorithms.base.MetaLearner; return one (docs/extending.md)"
        )
    check_batch_update(learner, cfg.algorithm.name)
    optimizer = build_optimizer(cfg.optimizer, cfg.trainer.meta_steps)
    root = jax.random.key(cfg.seed)
    state = init_train_state(learner, model, optimizer, jax.random.fold_in(root, INIT_STREAM))
    strategy = resolve_task_batching(
        cfg.trainer.task_batching, model, rl=isinstance(objective, RLObjective)
    )
    steps_per_call = resolve_steps_per_call(cfg.trainer.steps_per_call, model)
    train_key = jax.random.fold_in(root, TRAIN_STREAM)
    model_key = jax.random.fold_in(root, MODEL_STREAM)
    hyper = Hyper(
        train_key,
        model_key,
        {name: jnp.asarray(value, jnp.float32) for name, value in learner.hyper.items()},
        jnp.asarray(cfg.optimizer.lr, jnp.float32),
    )
    return Experiment(
        tasks,
        model,
        objective,
        learner,
        optimizer,
        strategy,
        steps_per_call,
        state,
        train_key=train_key,
        model_key=model_key,
        hyper=hyper,
    )


def count_parameters(tree: Any) -> int:
    return sum(int(x.size) for x in jax.tree_util.tree_leaves(tree))
