"""Meta-gradient estimators for MAML-RL: surrogates whose gradient is the estimate.

The objective is the expected return after adaptation, ``J(theta) = E_{tau ~ pi_theta}
E_{tau' ~ pi_{U(theta, tau)}} [R(tau')]``, where ``U`` is the sampled inner update. Its gradient
has two parts: the post-update policy gradient carried back through ``dU/dtheta``, and the
dependence of the pre-update samples ``tau`` on ``theta`` (a score-function term).

- ``"dice"``: DiCE, Foerster et al. 2018, "DiCE: The Infinitely Differentiable Monte
  Carlo Estimator", applied to the whole computation (pre-update sampling, inner update,
  post-update sampling). Its gradient adds ``R(tau') grad log p_theta(tau)`` to the post-update
  term: unbiased for ``grad J`` (the correction of E-MAML, Stadie et al. 2018). As a control
  variate, each pre-update batch's own return ``R(tau)`` is subtracted from that coefficient and
  its exact expectation, ``grad E[R(tau)]``, added back as a policy gradient on the same batch
  (``sum_t gamma^t A_t grad log pi``): still unbiased (with the fitted baseline, as unbiased as
  any policy gradient), and less noisy since ``R(tau')`` and ``R(tau)`` share the task. Still
  too noisy to train 2D navigation at 20 rollouts per task (experiments/rl/README.md).
- ``"lvc"`` (the meta-iteration's default): ProMP's low-variance curvature estimator,
  Rothfuss et al. 2019, "ProMP: Proximal Meta-Policy Search": the inner step uses
  ``pi / stop(pi) * A``, whose Hessian carries the per-step score outer products. Lower
  variance, biased (cross-time terms dropped).
- ``"maml"``: the original MAML-RL estimator, Finn et al. 2017: differentiates through the
  inner step of ``log pi * A`` only, ignoring how the pre-update samples depend on ``theta``.
  Biased; kept to reproduce the paper.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from metalearn.core.batching import mean_over_tasks
from metalearn.rl.baseline import advantages, discounted_returns
from metalearn.rl.envs.base import Env
from metalearn.rl.inner import InnerConfig, adapt_from_batches, inner_step, sample_adaptation
from metalearn.rl.policy import gaussian_kl
from metalearn.rl.rollout import PolicyApply, Trajectories, log_probs, rollouts

ESTIMATORS = ("dice", "lvc", "maml")
Params = Any


class TaskBatch(NamedTuple):
    """Everything one task's meta-gradient needs, sampled once with the current parameters.

    ``pre``/``pre_adv``: one batch per inner step and its inner-step advantages;
    ``pre_logp``: per-step log-probabilities under the parameters that sampled each batch;
    ``pre_weight``: the DiCE weight of each pre-update step, ``R(tau') - R(tau) + gamma^t A_t / N``
    (see the module docstring); ``post_*``: the post-update batch, its advantages,
    log-probabilities and action distribution; ``post_return``: its mean discounted return.
    """

    pre: tuple[Trajectories, ...]
    pre_adv: tuple[jax.Array, ...]
    pre_logp: tuple[jax.Array, ...]
    pre_weight: tuple[jax.Array, ...]
    post: Trajectories
    post_adv: jax.Array
    post_logp: jax.Array
    post_mean: jax.Array
    post_log_std: jax.Array
    post_return: jax.Array


def collect_task_batch(
    env: Env,
    policy_apply: PolicyApply,
    params: Params,
    key: jax.Array,
    task: Any,
    cfg: InnerConfig,
    num_post_rollouts: int,
) -> TaskBatch:
    """Sample the inner loop and the post-update batch of one task (no gradient through it)."""
    params = jax.lax.stop_gradient(params)
    inner_key, post_key = jax.random.split(key)
    pre, pre_adv, adapted = sample_adaptation(env, policy_apply, params, inner_key, task, cfg)
    path = adapt_from_batches(policy_apply, params, pre, pre_adv, cfg.lrs)
    pre_logp = tuple(log_probs(policy_apply, p, t) for p, t in zip(path, pre, strict=False))
    post = rollouts(env, policy_apply, adapted, post_key, task, num_post_rollouts)
    post_adv = advantages(post, cfg.discount, baseline=cfg.baseline, normalize=False)
    mean, log_std = policy_apply(adapted, post.obs)
    post_return = jnp.mean(discounted_returns(post.rewards, post.mask, cfg.discount)[:, 0])
    pre_weight = tuple(_dice_weight(t, post_return, cfg) for t in pre)
    return TaskBatch(
        pre=tuple(pre),
        pre_adv=tuple(pre_adv),
        pre_logp=pre_logp,
        pre_weight=pre_weight,
        post=post,
        post_adv=post_adv,
        post_logp=log_probs(policy_apply, adapted, post),
        post_mean=mean,
        post_log_std=log_std,
        post_return=post_return,
    )


def _dice_weight(traj: Trajectories, post_return: jax.Array, cfg: InnerConfig) -> jax.Array:
    """Per-step weight of ``log pi`` in the DiCE term: ``R(tau') - R(tau) + gamma^t A_t / N``."""
    returns = discounted_returns(traj.rewards, traj.mask, cfg.discount)
    own_return = jnp.mean(returns[:, 0])
    adv = advantages(traj, cfg.discount, baseline=cfg.baseline, normalize=False)
    discounting = cfg.discount ** jnp.arange(traj.rewards.shape[-1])
    num = traj.rewards.shape[0]
    return (post_return - own_return + discounting * adv / num) * traj.mask


def adapted_params(
    policy_apply: PolicyApply, params: Params, batch: TaskBatch, cfg: InnerConfig, estimator: str
) -> list[Params]:
    """``[theta_0, ..., theta_S]`` recomputed from ``params`` on the stored pre-update batches."""
    lvc = estimator == "lvc"
    return adapt_from_batches(policy_apply, params, batch.pre, batch.pre_adv, cfg.lrs, lvc=lvc)


def post_ratio(policy_apply: PolicyApply, adapted: Params, batch: TaskBatch) -> jax.Array:
    """Per-step likelihood ratio of the post-update actions, new over sampling policy."""
    return jnp.exp(log_probs(policy_apply, adapted, batch.post) - batch.post_logp)


def pre_term(
    policy_apply: PolicyApply, path: list[Params], batch: TaskBatch, estimator: str
) -> jax.Array:
    """The DiCE score term, linearised at the sampling parameters (0 for other estimators):
    ``sum_s sum_{i,t} (log pi_{theta_s}(a) - log pi_old(a)) w_{s,i,t}``."""
    total = jnp.zeros(())
    if estimator != "dice":
        return total
    for params, traj, old, weight in zip(
        path, batch.pre, batch.pre_logp, batch.pre_weight, strict=False
    ):
        delta = log_probs(policy_apply, params, traj) - old
        total = total + jnp.sum(delta * jax.lax.stop_gradient(weight))
    return total


def meta_surrogate(
    policy_apply: PolicyApply,
    params: Params,
    batch: TaskBatch,
    cfg: InnerConfig,
    estimator: str = "dice",
) -> jax.Array:
    """One task's surrogate: its gradient at the sampling parameters is the meta-gradient.

    Post-update term: mean over rollouts of ``sum_t ratio_t A_t`` (gradient of the expected
    discounted return); plus the DiCE pre-update term when ``estimator == "dice"``.
    """
    path = adapted_params(policy_apply, params, batch, cfg, estimator)
    ratio = post_ratio(policy_apply, path[-1], batch)
    post = jnp.mean(jnp.sum(ratio * batch.post_adv * batch.post.mask, axis=-1))
    return post + pre_term(policy_apply, path, batch, estimator)


def post_kl(
    policy_apply: PolicyApply,
    params: Params,
    batch: TaskBatch,
    cfg: InnerConfig,
    estimator: str = "dice",
) -> jax.Array:
    """Mean over valid post-update steps of ``KL(sampling policy || adapted from params)``."""
    adapted = adapted_params(policy_apply, params, batch, cfg, estimator)[-1]
    mean, log_std = policy_apply(adapted, batch.post.obs)
    kl = gaussian_kl(batch.post_mean, batch.post_log_std, mean, log_std)
    return jnp.sum(kl * batch.post.mask) / jnp.sum(batch.post.mask)


def post_kl_fisher(
    policy_apply: PolicyApply,
    params: Params,
    batch: TaskBatch,
    cfg: InnerConfig,
    estimator: str = "dice",
    strategy: str = "vmap",
):
    """``v -> H v`` with ``H`` the Hessian at ``params`` of the mean over tasks of
    :func:`post_kl` (``batch`` stacked over tasks), in Gauss-Newton form ``J^T F J``; each
    product is the mean of the tasks' own products, batched as ``strategy`` says
    (:func:`~metalearn.core.batching.mean_over_tasks`).

    ``J`` is the Jacobian of each task's adapted parameters and ``F`` the Hessian of the KL in
    them. At the sampling parameters the KL's gradient in the adapted parameters is zero, so
    ``J^T F J`` is the exact Hessian, at second-order autodiff cost instead of the third order
    of differentiating ``grad(post_kl)`` through the inner step; tests/rl/test_trpo.py checks it
    against :func:`metalearn.hvp`.

    - ``J = J_S ... J_1``, each inner step's ``J_s = I + lr_s H_s`` with ``H_s`` the Hessian of
      that step's surrogate: symmetric, so ``J^T`` applies the same linear maps in reverse order
      (``jax.linearize`` of the step; no transposed program).
    - ``F = D^T W D``, with ``D`` the Jacobian of the policy's outputs (mean and log-std) on the
      post-update observations and ``W`` the KL's Hessian in those outputs at the sampling
      policy: ``1 / sigma^2`` for the mean, 2 for the log-std, per valid step (the cross terms
      vanish where the two policies agree).

    Each product linearises a task's maps again (a forward pass more than keeping them from one
    linearisation for all products); under ``vmap`` on a CPU that costs nothing measurable
    (experiments/benchmarks/README.md, section RL), and it lets a loop over the tasks hold
    one task's intermediates at a time.
    """
    lvc = estimator == "lvc"

    def task_product(task: TaskBatch, v: Params) -> Params:
        theta, steps = params, []
        for traj, adv, lr in zip(task.pre, task.pre_adv, cfg.lrs, strict=False):
            step = lambda p, t=traj, a=adv, r=lr: inner_step(policy_apply, p, t, a, r, lvc=lvc)  # noqa: E731
            theta, linear = jax.linearize(step, theta)
            steps.append(linear)
        for linear in steps:
            v = linear(v)
        (_, log_std), d_outputs = jax.linearize(lambda p: policy_apply(p, task.post.obs), theta)
        valid = task.post.mask  # (rollouts, horizon): the task's KL is a mean over these
        weight = (valid / jnp.sum(valid))[..., None]
        d_mean, d_log_std = d_outputs(v)
        (v,) = jax.linear_transpose(d_outputs, theta)(
            (d_mean * jnp.exp(-2.0 * log_std) * weight, 2.0 * d_log_std * weight)
        )
        for linear in reversed(steps):
            v = linear(v)
        return v

    return lambda v: mean_over_tasks(lambda task: task_product(task, v), batch, strategy)


def task_loss(
    env: Env,
    policy_apply: PolicyApply,
    cfg: InnerConfig,
    num_post_rollouts: int,
    estimator: str = "dice",
):
    """A task's loss ``(params, model_state, key, task) -> (loss, aux)`` for a generic learner.

    ``jax.grad`` of the loss is minus the meta-gradient estimate (the DiCE one by default).
    ``aux`` holds the post-update return.

    >>> from metalearn.rl.envs import NAV2D
    >>> from metalearn.rl.policy import init_policy, policy_apply
    >>> loss = task_loss(NAV2D, policy_apply, InnerConfig(num_rollouts=2), num_post_rollouts=2)
    >>> params = init_policy(jax.random.key(0), 2, 2, hidden=(8,))
    >>> grads, (_, aux) = jax.grad(loss, has_aux=True)(params, None, jax.random.key(1),
    ...                                                jnp.array([0.3, -0.2]))
    >>> grads["log_std"].shape, bool(aux["post_return"] < 0)
    ((2,), True)
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")

    def loss(params, model_state, key, task):
        batch = collect_task_batch(env, policy_apply, params, key, task, cfg, num_post_rollouts)
        surrogate = meta_surrogate(policy_apply, params, batch, cfg, estimator)
        return -surrogate, (model_state, {"post_return": batch.post_return})

    return loss
