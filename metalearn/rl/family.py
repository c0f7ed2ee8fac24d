"""Reinforcement-learning task families for the runner: ``data=nav2d`` (any registered env).

A task is one draw of the environment's task distribution (a goal, a target velocity), put in
both ``support`` and ``query`` of a :class:`~metalearn.data.task.Task`: the data an inner step
adapts on and the data the adapted policy is judged on are rollouts, which the loss samples
with the key it is given. The family's objective (:class:`RLObjective`) is the policy-gradient
surrogate of ``rollouts`` episodes (minus the mean over valid steps of ``log pi(a|s) A`` with
the linear baseline and normalised advantages: rllab's VPG, the inner step of Finn et al.),
with the mean undiscounted episode ``return`` as the metric that selects the best parameters.
So a generic algorithm (``algorithm=maml``) meta-trains it as it would any family;
``algorithm=maml_rl`` (:mod:`metalearn.rl.algorithm`) reads the environment and the policy
from the objective and takes Finn et al.'s TRPO step instead.

Tasks of every split come from the environment's one distribution; held-out tasks are other
draws of it (the evaluation's own key stream, ``eval.seed``). ``shots`` means nothing here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from metalearn.core.checks import check_count
from metalearn.data.task import Aux, Task, TaskFamily
from metalearn.models.base import Model
from metalearn.registry import TASKS
from metalearn.rl import lapack
from metalearn.rl.baseline import advantages
from metalearn.rl.envs.base import ENVS, Env, make_env
from metalearn.rl.inner import InnerConfig, inner_surrogate
from metalearn.rl.rollout import PolicyApply, episode_returns, rollouts


@dataclasses.dataclass
class RLTasksConfig:
    """An environment's task distribution (``env``: a name registered in
    :data:`metalearn.rl.envs.base.ENVS`); ``rollouts`` episodes per inner-step batch and per
    loss evaluation; ``discount`` of the returns the advantages use; ``horizon`` steps per
    episode (0: the environment's own, 100 for nav2d and 200 for locomotion, as in Finn et al.;
    fewer make a run on a CPU affordable)."""

    # Read in training only (metalearn.evaluate refuses them as overrides).
    TRAINING_ONLY: ClassVar[Mapping[str, str]] = {
        "rollouts": "algorithm.eval_rollouts are the evaluation's episodes",
    }

    name: str = "rl_env"
    env: str = "nav2d"
    rollouts: int = InnerConfig.num_rollouts
    discount: float = InnerConfig.discount
    horizon: int = 0

    def __post_init__(self) -> None:  # a bad value is refused when the config is made
        if self.env not in ENVS:
            raise ValueError(f"data.env must be one of {sorted(ENVS)}, got {self.env!r}")
        check_count("data.rollouts", self.rollouts)
        if not 0.0 < self.discount <= 1.0:
            raise ValueError(f"data.discount must be in (0, 1], got {self.discount!r}")
        horizon = self.horizon
        if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 0:
            raise ValueError(
                f"data.horizon must be an integer >= 0 (0: the env's own), got {horizon!r}"
            )


class RLObjective(NamedTuple):
    """An :class:`~metalearn.data.task.Objective` (the same fields first, so the runner and
    the evaluation read it as one) that also carries what an RL algorithm samples with: the
    environment, the policy as ``policy_apply(params, obs) -> (mean, log_std)`` and the
    inner loop's settings (``inner.num_rollouts``, ``inner.discount``)."""

    model: Model
    loss: Callable
    primary_metric: str
    maximize: bool
    gauss_newton: None
    env: Env
    policy_apply: PolicyApply
    inner: InnerConfig


def policy_of(model: Model, obs_dim: int) -> PolicyApply:
    """``policy_apply(params, obs) -> (mean, log_std)`` of a stateless policy model; ValueError
    unless the model returns such a pair (``model=gaussian_mlp`` does)."""
    obs = jnp.zeros((1, obs_dim))

    def outputs(key):
        params, state = model.init(key)
        return model.apply(params, state, None, obs, False)[0]

    shapes = jax.eval_shape(outputs, jax.random.key(0))
    if not (isinstance(shapes, tuple) and len(shapes) == 2):
        raise ValueError(
            "an RL task family needs a policy model that returns (mean, log_std) of its "
            f"actions, got outputs {jax.tree.map(lambda s: s.shape, shapes)}; use "
            "model=gaussian_mlp"
        )
    return lambda params, x: model.apply(params, {}, None, x, False)[0]


def rl_objective(env: Env, config: RLTasksConfig) -> Callable[[Model], RLObjective]:
    """The family's ``objective(model)``: the VPG surrogate and the mean episode return."""
    inner = InnerConfig(num_rollouts=config.rollouts, discount=config.discount)

    def objective(model: Model) -> RLObjective:
        policy_apply = policy_of(model, env.obs_dim)

        def loss(params, model_state, key, task, train=True):
            del train
            traj = rollouts(
                env, policy_apply, jax.lax.stop_gradient(params), key, task, inner.num_rollouts
            )
            adv = advantages(traj, inner.discount, baseline=inner.baseline, normalize=True)
            value = -inner_surrogate(policy_apply, params, traj, adv)
            return value, Aux(model_state, {"return": jnp.mean(episode_returns(traj))})

        return RLObjective(model, loss, "return", True, None, env, policy_apply, inner)

    return objective


@TASKS.register(
    "rl_env",
    RLTasksConfig,
    large_tasks=True,
    prepare_process=lapack.prepare_process,
    run_refusal=lapack.lapack_batch_error,
    run_warning=lapack.lapack_device_warning,
)
def rl_env(config: RLTasksConfig | None = None) -> TaskFamily:
    """The task family of the registered environment ``config.env``.

    >>> family = rl_env(RLTasksConfig(env="nav2d"))
    >>> task = family.sample(family.splits["train"], jax.random.key(0), 1)
    >>> task.support.shape, family.input_shape, family.num_outputs
    ((2,), (2,), 2)
    """
    c = config or RLTasksConfig()
    env = make_env(c.env)
    if c.horizon:
        env = env._replace(horizon=c.horizon)

    def sample(split_arrays: Any, key: jax.Array, shots: int) -> Task:
        del split_arrays
        if shots != 1:  # each value of eval.shots would be reported as if it meant something
            raise ValueError(
                f"shots={shots} means nothing for an RL task, which takes 1 (its rollouts per "
                "inner step are data.rollouts, and algorithm.eval_rollouts in evaluation)"
            )
        task = jax.tree.map(lambda x: x[0], env.sample_tasks(key, 1))
        return Task(support=task, query=task)

    return TaskFamily(
        splits={"train": {}, "val": {}, "test": {}},
        sample=sample,
        input_shape=(env.obs_dim,),
        num_outputs=env.action_dim,
        objective=rl_objective(env, c),
    )
