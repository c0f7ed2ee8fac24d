"""MAML++ (Antoniou, Edwards and Storkey 2019, "How to train your MAML").

What is implemented, in the paper's terms:

- **Multi-step loss (MSL)**: the meta-loss is a weighted sum of the query losses after every
  inner step. The weights start uniform and anneal toward the last step over the first
  ``msl_fraction`` of training (the reference code's schedule, with a floor of ``0.03 /
  inner_steps`` for the earlier steps); afterwards only the last step counts.
- **LSLR**: a learned inner rate per parameter entry (per layer, per weight/bias) and per step:
  ``inner_lr * inner_lr_scale[name][step]``, the meta-parameters ``inner_lr_scale`` starting at
  1. Learning the multiplier rather than the rate itself keeps the outer optimiser's steps
  relative: Adam moves every parameter by about its learning rate per step, so rates of 0.01
  learned directly with Adam at 1e-3 change by ~10% a step, flip sign within a few hundred steps
  and make the inner loop diverge (seen on sinusoid); multipliers of 1 change by ~0.1%.
- **Derivative-order annealing (DA)**: first-order meta-gradients while
  ``progress < first_order_fraction``, second-order afterwards. ``progress`` is
  ``ctx.step / ctx.meta_steps`` (the integer step of the training state), a traced scalar, so
  both gradients are compiled into one step and ``lax.cond`` runs one of them: keep the step
  unbatched when vmapping ``task_grad`` over tasks, or ``cond`` turns into a select that
  computes both.
- **Per-step batch-norm weights (BNWB)**: with ``per_step_norm``, every parameter of a
  normalisation layer (``Model.norm_paths``: the model declares them, found by layer type)
  gets ``inner_steps`` meta-learned copies; the forward pass after ``k`` inner steps uses copy
  ``k`` (``k = 0`` is the parameter itself). These parameters are not adapted in the inner
  loop (as in the reference code).
- **Cosine-annealed meta learning rate (CA)**: the outer schedule has one home, the experiment's
  ``optimizer`` config; ``conf/algorithm/mamlpp.yaml`` recommends ``optimizer.schedule=cosine``
  with ``optimizer.final_lr_fraction=0.01``, which any experiment or command line overrides.

Not implemented: per-step batch-norm *running statistics* (BNRS). The models here normalise with
the current batch's statistics and keep no running statistics, so there is nothing to keep per
step. Evaluating for more steps than ``inner_steps`` reuses the last step's rates and norm copy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

import jax
import jax.numpy as jnp

from metalearn.algorithms.base import (
    InnerLoopConfig,
    MetaLearner,
    check_fraction,
    declared_norm_paths,
    hyperparameter_values,
    hyperparameters,
    inner_loss,
    named_leaves,
    path_name,
    query_loss,
    query_metrics,
    with_config,
)
from metalearn.core import adapt
from metalearn.data.task import Aux, Objective, Task
from metalearn.registry import ALGORITHMS


@dataclasses.dataclass
class MAMLPPConfig(InnerLoopConfig):
    # Read in training only (metalearn.evaluate refuses them as overrides). Its inner_steps
    # shape the per-step parameters, which the evaluation reads.
    TRAINING_ONLY: ClassVar[Mapping[str, str]] = {
        "msl_fraction": "",
        "first_order_fraction": "",
    }

    name: str = "mamlpp"
    inner_steps: int = 5
    learn_inner_lr: bool = True
    msl_fraction: float = 0.1
    first_order_fraction: float = 0.3
    per_step_norm: bool = True

    def __post_init__(self) -> None:  # a bad value is refused when the config is made
        super().__post_init__()
        check_fraction("msl_fraction", self.msl_fraction)
        check_fraction("first_order_fraction", self.first_order_fraction)


def multi_step_loss_weights(progress: jax.Array, num_steps: int, msl_fraction: float) -> jax.Array:
    """Per-step weights ``[num_steps]`` of the multi-step loss at training ``progress``.

    Uniform at ``progress = 0``; the earlier weights fall linearly (to a floor of
    ``0.03 / num_steps``) and the last rises, reaching the floor at ``progress = 0.97 *
    msl_fraction``; from ``progress = msl_fraction`` on, all weight is on the last step. The
    weights always sum to 1.

    >>> [round(float(w), 3) for w in multi_step_loss_weights(0.0, 4, 0.1)]
    [0.25, 0.25, 0.25, 0.25]
    >>> [round(float(w), 3) for w in multi_step_loss_weights(0.05, 4, 0.1)]
    [0.125, 0.125, 0.125, 0.625]
    >>> [round(float(w), 3) for w in multi_step_loss_weights(0.1, 4, 0.1)]
    [0.0, 0.0, 0.0, 1.0]
    """
    last_only = jax.nn.one_hot(num_steps - 1, num_steps)
    if num_steps == 1 or msl_fraction <= 0:
        return last_only
    progress = jnp.asarray(progress, jnp.float32)
    t = progress / msl_fraction
    floor = 0.03 / num_steps
    early = jnp.maximum((1.0 - t) / num_steps, floor)
    last = jnp.minimum((1.0 + t * (num_steps - 1)) / num_steps, 1.0 - (num_steps - 1) * floor)
    annealing = jnp.concatenate([jnp.full(num_steps - 1, early), last[None]])
    return jnp.where(progress >= msl_fraction, last_only, annealing)


@ALGORITHMS.register("mamlpp", MAMLPPConfig)
def mamlpp(objective: Objective, config: MAMLPPConfig | None = None, **overrides) -> MetaLearner:
    """MAML++: multi-step loss, per-layer per-step rates, derivative-order annealing, per-step
    normalisation weights (see the module docstring).

    Meta-parameters: ``{"params": theta, "inner_lr_scale": {name: [inner_steps]}, "norm":
    {name: [inner_steps, *shape]}}`` (``inner_lr_scale`` only with ``learn_inner_lr``, ``norm``
    only with ``per_step_norm`` and normalisation parameters in the model). ``msl_fraction`` and
    ``first_order_fraction`` are fractions of training (``ctx.progress()``); 0 turns the
    feature off.

    >>> import jax, jax.numpy as jnp
    >>> from metalearn.algorithms.base import context
    >>> from metalearn.data.sinusoid import sinusoid
    >>> from metalearn.data.task import family_objective
    >>> from metalearn.models.base import model_from_flax
    >>> from metalearn.models.mlp import MLP
    >>> tasks = sinusoid()
    >>> model = model_from_flax(MLP((40, 40), 1), (1,))
    >>> learner = mamlpp(family_objective(tasks, model), inner_lr=0.01, inner_steps=3)
    >>> params, state = model.init(jax.random.key(1))
    >>> meta_params = learner.init(jax.random.key(0), params)
    >>> len(meta_params["inner_lr_scale"]), meta_params["inner_lr_scale"]["hidden_0/kernel"].shape
    (6, (3,))
    >>> task = tasks.sample(tasks.splits["train"], jax.random.key(2), 10)
    >>> ctx = context(state, step=50, meta_steps=100)
    >>> grads, aux = jax.jit(learner.task_grad)(meta_params, task, ctx)
    >>> jax.jit(learner.evaluate, static_argnums=3)(meta_params, task, ctx, (0, 1, 3, 5))[
    ...     "mse"].shape
    (4,)
    """
    c = with_config(MAMLPPConfig, config, overrides)
    own = hyperparameters(c)
    num_steps = c.inner_steps
    declared_norms = declared_norm_paths(objective)

    def norm_names(params) -> list[str]:
        if not c.per_step_norm:
            return []
        return [name for name in named_leaves(params) if name in declared_norms]

    def init(key, model_params):
        del key
        meta_params = {"params": model_params}
        leaves = named_leaves(model_params)
        norms = norm_names(model_params)
        if c.learn_inner_lr:
            meta_params["inner_lr_scale"] = {
                name: jnp.ones((num_steps,), jnp.asarray(leaf).dtype)
                for name, leaf in leaves.items()
                if name not in norms
            }
        if norms:
            meta_params["norm"] = {
                name: jnp.broadcast_to(leaves[name], (num_steps, *jnp.shape(leaves[name])))
                for name in norms
            }
        return meta_params

    def with_norm(meta_params, fast, k: int):
        """Model parameters ``fast`` with the normalisation copy for step ``k`` swapped in."""
        norm = meta_params.get("norm")
        k = min(k, num_steps)
        if not norm or k == 0:
            return fast
        return jax.tree_util.tree_map_with_path(
            lambda path, leaf: norm[path_name(path)][k - 1] if path_name(path) in norm else leaf,
            fast,
        )

    def rates_at(meta_params, k: int, ctx):
        """The inner rate tree for step ``k`` (0 for per-step normalisation parameters)."""
        k = min(k, num_steps - 1)
        norms = set(meta_params.get("norm", {}))
        learned = meta_params.get("inner_lr_scale")
        inner_lr = hyperparameter_values(ctx, own).inner_lr

        def rate(path, leaf):
            name = path_name(path)
            if name in norms:
                return jnp.zeros((), jnp.asarray(leaf).dtype)
            return inner_lr * learned[name][k] if learned is not None else inner_lr

        return jax.tree_util.tree_map_with_path(rate, meta_params["params"])

    def trajectory_of(meta_params, support, ctx, steps: int, first_order: bool, train=True):
        """Model parameters after 0, 1, ..., ``steps`` inner steps (a list)."""
        loss_fn = inner_loss(objective, ctx, train)
        fast = meta_params["params"]
        trajectory = [with_norm(meta_params, fast, 0)]
        for k in range(steps):
            loss_k = lambda p, b, k=k: loss_fn(with_norm(meta_params, p, k), b)  # noqa: E731
            rates = rates_at(meta_params, k, ctx)
            fast = adapt(loss_k, fast, support, inner_lr=rates, first_order=first_order)
            trajectory.append(with_norm(meta_params, fast, k + 1))
        return trajectory

    def meta_loss(meta_params, task: Task, ctx, weights, first_order: bool):
        trajectory = trajectory_of(meta_params, task.support, ctx, num_steps, first_order)
        results = [query_loss(objective, p, ctx, task.query) for p in trajectory[1:]]
        losses = jnp.stack([loss for loss, _ in results])
        return jnp.sum(weights * losses), results[-1][1]

    def task_grad(meta_params, task: Task, ctx) -> tuple[dict, Aux]:
        progress = ctx.progress()
        weights = multi_step_loss_weights(progress, num_steps, c.msl_fraction)

        def grad(first_order: bool):
            def run(mp):
                (_, aux), grads = jax.value_and_grad(meta_loss, has_aux=True)(
                    mp, task, ctx, weights, first_order
                )
                return grads, aux

            return run

        if c.first_order_fraction <= 0:
            return grad(False)(meta_params)
        if c.first_order_fraction >= 1:
            return grad(True)(meta_params)
        return jax.lax.cond(progress < c.first_order_fraction, grad(True), grad(False), meta_params)

    def evaluate(meta_params, task: Task, ctx, steps):
        steps = tuple(int(s) for s in steps)
        trajectory = trajectory_of(
            meta_params, task.support, ctx, max(steps), first_order=True, train=False
        )
        picked = jax.tree_util.tree_map(lambda *ps: jnp.stack(ps), *[trajectory[s] for s in steps])
        return jax.vmap(lambda p: query_metrics(objective, p, ctx, task.query))(picked)

    def adapt_params(meta_params, support, ctx, steps=num_steps):
        return trajectory_of(meta_params, support, ctx, steps, first_order=False)[-1]

    return MetaLearner(init, task_grad, evaluate, adapt_params, hyper=own)
