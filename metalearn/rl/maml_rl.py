"""MAML-RL's whole meta-iteration as one compiled function (Finn et al. 2017, Section 5.3).

One call samples a meta-batch of tasks, runs every task's inner loop and post-update rollouts
(``vmap`` over rollouts, ``lax.scan`` over time, and over tasks ``vmap`` or, on a CPU, a loop:
``task_batching``), and takes the outer step (TRPO or the clipped surrogate) on the chosen
meta-gradient estimator. ``num_steps=0`` in the inner config gives plain TRPO/PPO on the task
distribution ("pretrained on all tasks").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from metalearn.core.batching import (
    TASK_BATCHING,
    is_task_batching,
    map_over_tasks,
    mean_over_tasks,
    resolve_auto,
)
from metalearn.rl.envs.base import Env
from metalearn.rl.estimators import (
    ESTIMATORS,
    TaskBatch,
    collect_task_batch,
    meta_surrogate,
    post_kl,
    post_kl_fisher,
)
from metalearn.rl.inner import InnerConfig, sample_adaptation
from metalearn.rl.ppo import PPOConfig, clipped_surrogate, ppo_epochs
from metalearn.rl.rollout import PolicyApply, Trajectories, episode_returns, rollouts
from metalearn.rl.trpo import TRPOConfig, trpo_step

Params = Any


@dataclass(frozen=True)
class MAMLRLConfig:
    """Finn et al.'s 2D navigation: 20 tasks, 20 + 20 rollouts each, TRPO with KL 0.01.

    The default estimator is ProMP's ``"lvc"``: it accounts for the pre-update sampling
    distribution at low variance. ``"dice"`` is exactly unbiased (tests/rl/test_estimators.py)
    but its score term over all 20 x 100 pre-update steps is too noisy at these batch sizes
    (experiments/rl/README.md); ``"maml"`` reproduces the paper's estimator.

    ``task_batching``: how the tasks are batched in sampling, the meta-gradient, the
    Fisher-vector products and the line search (:func:`~metalearn.core.batching.map_over_tasks`);
    ``auto`` loops over them on a CPU (each task's adapted weights under ``vmap`` make batched
    matrix products, which XLA:CPU runs far slower) and uses ``vmap`` elsewhere.
    """

    num_tasks: int = 20
    num_post_rollouts: int = 20
    inner: InnerConfig = field(default_factory=InnerConfig)
    estimator: str = "lvc"
    outer: str = "trpo"
    trpo: TRPOConfig = field(default_factory=TRPOConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    task_batching: str = "auto"

    def __post_init__(self) -> None:
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {self.estimator!r}")
        if self.outer not in ("trpo", "ppo"):
            raise ValueError(f"outer must be 'trpo' or 'ppo', got {self.outer!r}")
        task_strategy(self.task_batching)  # raises on an unknown name

    @property
    def strategy(self) -> str:
        """``task_batching`` with ``auto`` resolved for this backend."""
        return task_strategy(self.task_batching)


def task_strategy(task_batching: str) -> str:
    """The strategy of :func:`~metalearn.core.batching.map_over_tasks` that ``task_batching``
    names for RL tasks (``auto``: a loop on a CPU, ``vmap`` elsewhere); a ValueError for a name
    that is none.

    >>> task_strategy("map2")
    'map2'
    """
    if not is_task_batching(task_batching):
        raise ValueError(
            f"task_batching must be one of {TASK_BATCHING} or map<k>, got {task_batching!r}"
        )
    return resolve_auto(task_batching, large_tasks=True)


class MetaRLState(NamedTuple):
    """Policy parameters and the outer optimiser's state (empty for TRPO)."""

    params: Params
    opt_state: Any


def collect_meta_batch(
    env: Env, policy_apply: PolicyApply, cfg: MAMLRLConfig, params: Params, keys, tasks
) -> TaskBatch:
    """Every task's inner loop and post-update batch, over the tasks and their keys as
    ``cfg.task_batching`` says."""

    def collect(key_and_task):
        key, task = key_and_task
        return collect_task_batch(
            env, policy_apply, params, key, task, cfg.inner, cfg.num_post_rollouts
        )

    return map_over_tasks(collect, (keys, tasks), cfg.strategy)


def _mean_over_tasks(fn: Callable, batch: TaskBatch, strategy: str) -> Callable[[Params], Any]:
    """``params -> mean over the batch's tasks of fn(params, task_batch)`` (any pytree: a value,
    or with ``fn = jax.value_and_grad(...)`` a value and its gradient, each task differentiated
    on its own: in a loop over the tasks within its iteration, where the gradient of the loop
    keeps every task's intermediates; 2D navigation on the 2-core CPU: the meta-gradient in
    56 ms against 106 ms, experiments/benchmarks/README.md)."""
    return lambda p: mean_over_tasks(lambda b: fn(p, b), batch, strategy)


def _task_surrogate(policy_apply: PolicyApply, cfg: MAMLRLConfig) -> Callable:
    """``(params, task_batch) -> one task's meta-surrogate`` of ``cfg.estimator``."""
    return lambda p, b: meta_surrogate(policy_apply, p, b, cfg.inner, cfg.estimator)


def trpo_objectives(
    policy_apply: PolicyApply, cfg: MAMLRLConfig, batch: TaskBatch
) -> tuple[Callable[[Params], jax.Array], Callable[[Params], jax.Array]]:
    """TRPO's ``(surrogate, kl)`` on a collected meta-batch, each a function of the policy
    parameters: the meta-surrogate of ``cfg.estimator`` and the post-update policies' KL from
    the sampling ones, both means over the tasks (what :func:`outer_update` steps on)."""
    surrogate = _mean_over_tasks(_task_surrogate(policy_apply, cfg), batch, cfg.strategy)
    kl = _mean_over_tasks(
        lambda p, b: post_kl(policy_apply, p, b, cfg.inner, cfg.estimator), batch, cfg.strategy
    )
    return surrogate, kl


def surrogate_value_and_grad(
    policy_apply: PolicyApply, cfg: MAMLRLConfig, batch: TaskBatch
) -> Callable[[Params], tuple[jax.Array, Params]]:
    """``params -> (surrogate, gradient)`` of :func:`trpo_objectives`' surrogate, as the mean
    of the tasks' own values and gradients (what TRPO's step starts from)."""
    task_value_and_grad = jax.value_and_grad(_task_surrogate(policy_apply, cfg))
    return _mean_over_tasks(task_value_and_grad, batch, cfg.strategy)


def outer_update(
    policy_apply: PolicyApply,
    cfg: MAMLRLConfig,
    params: Params,
    opt_state: Any,
    optimizer: optax.GradientTransformation,
    batch: TaskBatch,
) -> tuple[Params, Any, dict]:
    """The outer step on a collected meta-batch: TRPO (``opt_state`` passed through) or
    ``cfg.ppo.num_epochs`` steps of ``optimizer`` on the clipped surrogate.

    Metrics: ``post_return`` (mean undiscounted return of the post-update rollouts),
    ``pre_return`` (of the first pre-update batch; absent without inner steps), and TRPO's
    :class:`~metalearn.rl.trpo.TRPOInfo` fields or PPO's last ``surrogate``.
    """

    metrics = {"post_return": jnp.mean(episode_returns(batch.post))}
    if batch.pre:
        metrics["pre_return"] = jnp.mean(episode_returns(batch.pre[0]))
    if cfg.outer == "trpo":
        surrogate, kl = trpo_objectives(policy_apply, cfg, batch)
        # the KL's Hessian as J^T F J: exact at the sampling parameters, second order
        fisher = post_kl_fisher(policy_apply, params, batch, cfg.inner, cfg.estimator, cfg.strategy)
        value_and_grad = surrogate_value_and_grad(policy_apply, cfg, batch)
        params, info = trpo_step(
            surrogate, kl, params, cfg.trpo, kl_hvp=fisher, surrogate_value_and_grad=value_and_grad
        )
        metrics.update(info._asdict())
        return params, opt_state, metrics
    value_and_grad = _mean_over_tasks(
        jax.value_and_grad(
            lambda p, b: clipped_surrogate(
                policy_apply, p, b, cfg.inner, cfg.estimator, cfg.ppo.clip
            )
        ),
        batch,
        cfg.strategy,
    )
    params, opt_state, value = ppo_epochs(
        value_and_grad, params, opt_state, optimizer, cfg.ppo.num_epochs
    )
    metrics["surrogate"] = value
    return params, opt_state, metrics


def make_meta_iteration(
    env: Env, policy_apply: PolicyApply, cfg: MAMLRLConfig
) -> tuple[Callable[[Params], MetaRLState], Callable]:
    """``(init, iteration)``; ``iteration(state, key) -> (state, metrics)`` is jitted: it samples
    ``cfg.num_tasks`` tasks, then :func:`collect_meta_batch` and :func:`outer_update` (the
    steps the runner's ``algorithm=maml_rl`` takes, :mod:`metalearn.rl.algorithm`).

    >>> from metalearn.rl.envs import NAV2D
    >>> from metalearn.rl.policy import init_policy, policy_apply
    >>> cfg = MAMLRLConfig(num_tasks=2, num_post_rollouts=2,
    ...                    inner=InnerConfig(num_rollouts=2), trpo=TRPOConfig(cg_iters=2))
    >>> init, iteration = make_meta_iteration(NAV2D, policy_apply, cfg)
    >>> state = init(init_policy(jax.random.key(0), 2, 2, hidden=(8,)))
    >>> state, metrics = iteration(state, jax.random.key(1))
    >>> sorted(metrics)[:3]
    ['accepted', 'backtracks', 'cg_nonpositive_curvature']
    """
    optimizer = optax.adam(cfg.ppo.lr)

    def init(params: Params) -> MetaRLState:
        return MetaRLState(params, optimizer.init(params) if cfg.outer == "ppo" else ())

    def iteration(state: MetaRLState, key: jax.Array) -> tuple[MetaRLState, dict]:
        task_key, sample_key = jax.random.split(key)
        tasks = env.sample_tasks(task_key, cfg.num_tasks)
        keys = jax.random.split(sample_key, cfg.num_tasks)
        batch = collect_meta_batch(env, policy_apply, cfg, state.params, keys, tasks)
        params, opt_state, metrics = outer_update(
            policy_apply, cfg, state.params, state.opt_state, optimizer, batch
        )
        return MetaRLState(params, opt_state), metrics

    return init, jax.jit(iteration)


def adaptation_batches(
    env: Env, policy_apply: PolicyApply, params: Params, key: jax.Array, task: Any, inner
) -> tuple[list[Trajectories], Params]:
    """One task's batches of ``inner.num_rollouts`` episodes after 0, 1, ..., ``inner.num_steps``
    inner steps (each step's batch is the one it stepped on; the last is sampled from the
    adapted parameters), and the adapted parameters."""
    inner_key, last_key = jax.random.split(key)
    batches, _, adapted = sample_adaptation(env, policy_apply, params, inner_key, task, inner)
    last = rollouts(env, policy_apply, adapted, last_key, task, inner.num_rollouts)
    return [*batches, last], adapted


def adaptation_returns(
    env: Env, policy_apply: PolicyApply, params: Params, key: jax.Array, task: Any, inner
) -> jax.Array:
    """One task's mean undiscounted return of ``inner.num_rollouts`` episodes after 0, 1, ...,
    ``inner.num_steps`` inner steps, shape ``(inner.num_steps + 1,)``
    (:func:`adaptation_batches`' returns)."""
    batches, _ = adaptation_batches(env, policy_apply, params, key, task, inner)
    return jnp.stack([jnp.mean(episode_returns(t)) for t in batches])


def make_adaptation_eval(
    env: Env, policy_apply: PolicyApply, inner: InnerConfig, task_batching: str = "auto"
) -> Callable[[Params, jax.Array, Any], jax.Array]:
    """Jitted ``(params, key, tasks) -> returns`` of shape ``(num_tasks, inner.num_steps + 1)``:
    :func:`adaptation_returns` of each task, the tasks batched as ``task_batching`` says (see
    :class:`MAMLRLConfig`).

    >>> from metalearn.rl.envs import NAV2D, sample_goals
    >>> from metalearn.rl.policy import init_policy, policy_apply
    >>> inner = InnerConfig(num_steps=2, lrs=(0.1, 0.05), num_rollouts=3)
    >>> evaluate = make_adaptation_eval(NAV2D, policy_apply, inner)
    >>> params = init_policy(jax.random.key(0), 2, 2, hidden=(8,))
    >>> evaluate(params, jax.random.key(1), sample_goals(jax.random.key(2), 4)).shape
    (4, 3)
    """
    strategy = task_strategy(task_batching)

    def evaluate(params, key, tasks):
        num = jax.tree.leaves(tasks)[0].shape[0]
        keys = jax.random.split(key, num)

        def one(key_and_task):
            return adaptation_returns(env, policy_apply, params, *key_and_task, inner)

        return map_over_tasks(one, (keys, tasks), strategy)

    return jax.jit(evaluate)
