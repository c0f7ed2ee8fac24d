"""How often the initial policy's mean action lies outside HalfCheetah's control range [-1, 1]:
10 rollouts of 100 steps (direction +1) of the 17-100-100-6 Glorot/ReLU policy at its
initialisation. Output: action_saturation.txt."""

import numpy as np

from metalearn.rl.lapack import schedule_lapack_calls_serially

schedule_lapack_calls_serially()  # before JAX's first computation

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from metalearn.rl.envs.locomotion import make_locomotion_env  # noqa: E402
from metalearn.rl.policy import init_policy, policy_apply  # noqa: E402
from metalearn.rl.rollout import rollouts  # noqa: E402

env = make_locomotion_env("cheetah_dir", horizon=100)
params = init_policy(jax.random.key(0), env.obs_dim, env.action_dim)
sample = jax.jit(lambda k: rollouts(env, policy_apply, params, k, jnp.float32(1.0), 10))
obs = np.asarray(sample(jax.random.key(1)).obs).reshape(-1, env.obs_dim)
print("obs abs mean per dim", np.round(np.abs(obs).mean(0), 2))
print("obs abs max", np.round(np.abs(obs).max(0), 1))
mean = np.abs(np.asarray(policy_apply(params, jnp.asarray(obs))[0]))
print(
    "mean action |mu|: mean", mean.mean(), "p90", np.percentile(mean, 90),
    "share |mu|>1", (mean > 1).mean(),
)  # fmt: skip
