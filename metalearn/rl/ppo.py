"""A clipped-surrogate outer loop (PPO, Schulman et al. 2017; as ProMP's outer step, Rothfuss
et al. 2019): several Adam steps on the clipped post-update objective, the inner update
recomputed from the stored pre-update batches at every step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax

from metalearn.rl.estimators import TaskBatch, adapted_params, post_ratio, pre_term
from metalearn.rl.inner import InnerConfig
from metalearn.rl.rollout import PolicyApply

Params = Any


@dataclass(frozen=True)
class PPOConfig:
    """ProMP's defaults: 5 Adam steps of 1e-3 per meta-iteration, clip 0.3."""

    lr: float = 1e-3
    clip: float = 0.3
    num_epochs: int = 5


def clipped_surrogate(
    policy_apply: PolicyApply,
    params: Params,
    batch: TaskBatch,
    cfg: InnerConfig,
    estimator: str,
    clip: float,
) -> jax.Array:
    """One task's ``mean_rollouts sum_t min(r A, clip(r, 1 - e, 1 + e) A)`` plus the DiCE term.

    >>> import jax.numpy as jnp
    >>> r, a = jnp.array([1.5, 0.5]), jnp.array([1.0, -1.0])
    >>> jnp.minimum(r * a, jnp.clip(r, 0.7, 1.3) * a)   # the per-step term, clip = 0.3
    Array([ 1.3, -0.7], dtype=float32)
    """
    path = adapted_params(policy_apply, params, batch, cfg, estimator)
    ratio = post_ratio(policy_apply, path[-1], batch)
    adv = batch.post_adv
    clipped = jnp.minimum(ratio * adv, jnp.clip(ratio, 1.0 - clip, 1.0 + clip) * adv)
    post = jnp.mean(jnp.sum(clipped * batch.post.mask, axis=-1))
    return post + pre_term(policy_apply, path, batch, estimator)


def ppo_epochs(
    value_and_grad: Callable[[Params], tuple[jax.Array, Params]],
    params: Params,
    opt_state: optax.OptState,
    optimizer: optax.GradientTransformation,
    num_epochs: int,
) -> tuple[Params, optax.OptState, jax.Array]:
    """``num_epochs`` steps of ``optimizer`` ascending an objective, given as
    ``value_and_grad(params) -> (value, gradient)`` (``jax.value_and_grad(objective)``, or the
    mean of the tasks' own); returns its last value."""

    def body(carry, _):
        params, opt_state = carry
        value, grads = value_and_grad(params)
        updates, opt_state = optimizer.update(jax.tree.map(jnp.negative, grads), opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), value

    (params, opt_state), values = jax.lax.scan(body, (params, opt_state), None, length=num_epochs)
    return params, opt_state, values[-1]
