"""A one-step Gaussian bandit whose expected post-adaptation return has a closed form.

Action ``a ~ N(mu, sigma^2)`` (``sigma`` fixed), reward ``-(a - g)^2``. The inner loop takes one
policy-gradient step of rate ``alpha`` on ``N`` samples, no baseline:
``g_hat = (1/N) sum_i (a_i - mu) / sigma^2 * r_i``. With ``a_i = mu + sigma eps_i``, ``d = mu - g``,
each term is ``-(d^2 eps + 2 d sigma eps^2 + sigma^2 eps^3) / sigma``, of mean ``-2 d`` and variance
``(d^4 + 14 d^2 sigma^2 + 15 sigma^4) / sigma^2`` (Gaussian moments 1, 3, 15). The expected return
after the step, ``E[-(mu' - g)^2] - sigma^2`` with ``mu' = mu + alpha g_hat``, is therefore

    J(mu) = -d^2 (1 - 2 alpha)^2 - alpha^2 (d^4 + 14 d^2 s^2 + 15 s^4) / (N s^2) - s^2

(``s = sigma``)

and ``jax.grad(J)`` is the exact meta-gradient. Written independently of metalearn.rl.
"""

from __future__ import annotations

import jax.numpy as jnp

from metalearn.rl.envs.base import Env

LOG_STD = 0.0


def _reset(key, goal):
    del key
    return jnp.asarray(goal)


def _step(goal, action):
    return goal, jnp.zeros(1), -((action[0] - goal) ** 2), jnp.asarray(True)


BANDIT = Env(
    reset=_reset,
    observation=lambda goal: jnp.zeros(1),
    step=_step,
    sample_tasks=lambda key, num: jnp.ones(num),
    obs_dim=1,
    action_dim=1,
    horizon=1,
)


def bandit_policy(params, obs):
    """``N(mu, exp(LOG_STD)^2)``, whatever the (constant) observation."""
    shape = obs.shape[:-1] + (1,)
    return jnp.broadcast_to(params["mu"], shape), jnp.full(shape, LOG_STD)


def exact_post_adaptation_return(mu, goal: float, lr: float, num_samples: int):
    """The closed form ``J(mu)`` of the module docstring."""
    sigma2 = jnp.exp(2 * LOG_STD)
    d = mu - goal
    spread = (d**4 + 14 * d**2 * sigma2 + 15 * sigma2**2) / (num_samples * sigma2)
    return -(d**2) * (1 - 2 * lr) ** 2 - lr**2 * spread - sigma2
