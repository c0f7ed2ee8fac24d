"""The inner loop: vanilla policy gradient with the linear baseline (Finn et al. 2017).

One inner step on a task samples ``num_rollouts`` episodes with the current parameters, fits
the baseline on them, and takes a gradient step of the policy-gradient surrogate (mean over the
batch's valid steps of ``log pi(a|s) * A``, rllab's VPG with ``center_adv``). Sampling happens
once (``sample_adaptation``); the adapted parameters are a deterministic, differentiable
function of the initial ones given those samples (``adapt_from_batches``), which is what the
meta-gradient estimators differentiate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from metalearn.rl.baseline import advantages
from metalearn.rl.envs.base import Env
from metalearn.rl.rollout import PolicyApply, Trajectories, log_probs, rollouts

Params = Any


@dataclass(frozen=True)
class InnerConfig:
    """Inner-loop settings; the defaults are Finn et al.'s 2D navigation (one step of 0.1 on 20
    rollouts, discount 0.99, linear baseline, normalised advantages).

    ``lrs`` gives the rate of each step (``num_steps`` of them); Finn et al. evaluate with 0.1
    for the first step and 0.05 afterwards.
    """

    num_steps: int = 1
    lrs: tuple[float, ...] = (0.1,)
    num_rollouts: int = 20
    discount: float = 0.99
    baseline: bool = True
    normalize: bool = True

    def __post_init__(self) -> None:
        if len(self.lrs) < self.num_steps:
            raise ValueError(f"{self.num_steps} inner steps need as many rates, got {self.lrs}")


def inner_surrogate(
    policy_apply: PolicyApply,
    params: Params,
    traj: Trajectories,
    adv: jax.Array,
    *,
    lvc: bool = False,
) -> jax.Array:
    """Mean over valid steps of ``log pi(a|s) A`` (or, with ``lvc``, ``pi / stop(pi) A``).

    Both have the same gradient (the policy gradient). Their Hessians differ: the ``lvc`` form,
    ProMP's low-variance curvature objective (Rothfuss et al. 2019, "ProMP: Proximal
    Meta-Policy Search"), adds the per-step score outer products ``grad log pi grad log pi^T A``
    that the plain form (MAML, Finn et al. 2017) leaves out.

    >>> from metalearn.rl.rollout import Trajectories
    >>> apply = lambda p, obs: (jnp.broadcast_to(p, obs.shape), jnp.zeros(obs.shape))
    >>> traj = Trajectories(jnp.zeros((1, 2, 1)), jnp.ones((1, 2, 1)), jnp.zeros((1, 2)),
    ...                     jnp.ones((1, 2)))
    >>> adv = jnp.array([[1.0, 3.0]])        # d/dmu log N(1; mu, 1) = 1 - mu = 1 at mu = 0
    >>> [float(jax.grad(lambda p: inner_surrogate(apply, p, traj, adv, lvc=lvc))(0.0))
    ...  for lvc in (False, True)]
    [2.0, 2.0]
    """
    logp = log_probs(policy_apply, params, traj)
    weight = jnp.exp(logp - jax.lax.stop_gradient(logp)) if lvc else logp
    return jnp.sum(weight * adv * traj.mask) / jnp.sum(traj.mask)


def inner_step(
    policy_apply: PolicyApply,
    params: Params,
    traj: Trajectories,
    adv: jax.Array,
    lr: float,
    *,
    lvc: bool = False,
) -> Params:
    """One gradient-ascent step of :func:`inner_surrogate`."""
    grads = jax.grad(lambda p: inner_surrogate(policy_apply, p, traj, adv, lvc=lvc))(params)
    return jax.tree_util.tree_map(lambda p, g: p + lr * g, params, grads)


def adapt_from_batches(
    policy_apply: PolicyApply,
    params: Params,
    batches: Sequence[Trajectories],
    advs: Sequence[jax.Array],
    lrs: Sequence[float],
    *,
    lvc: bool = False,
) -> list[Params]:
    """The parameters before each step and after the last: ``[theta_0, ..., theta_S]``."""
    path = [params]
    for traj, adv, lr in zip(batches, advs, lrs, strict=False):
        path.append(inner_step(policy_apply, path[-1], traj, adv, lr, lvc=lvc))
    return path


def sample_adaptation(
    env: Env,
    policy_apply: PolicyApply,
    params: Params,
    key: jax.Array,
    task: Any,
    cfg: InnerConfig,
) -> tuple[list[Trajectories], list[jax.Array], Params]:
    """Sample and adapt for ``cfg.num_steps`` steps: each step's batch, advantages, final params.

    Gradients do not flow through the sampling (``params`` is treated as a constant).
    """
    params = jax.lax.stop_gradient(params)
    batches, advs = [], []
    for step, step_key in enumerate(jax.random.split(key, cfg.num_steps)):
        traj = rollouts(env, policy_apply, params, step_key, task, cfg.num_rollouts)
        adv = advantages(traj, cfg.discount, baseline=cfg.baseline, normalize=cfg.normalize)
        params = inner_step(policy_apply, params, traj, adv, cfg.lrs[step])
        batches.append(traj)
        advs.append(adv)
    return batches, advs, params
