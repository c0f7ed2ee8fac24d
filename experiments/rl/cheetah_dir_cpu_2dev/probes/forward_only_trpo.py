"""Plain TRPO (no inner step) on HalfCheetah with every task forward (+1): does the outer loop
learn the robot at the CPU-reduced size (10 tasks x 20 rollouts x 100 steps per iteration)?
``python forward_only_trpo.py cheetah_dir 40``; output: forward_only_trpo.txt."""

import sys
import time

from metalearn.rl.lapack import schedule_lapack_calls_serially

schedule_lapack_calls_serially()  # before JAX's first computation

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from metalearn.rl.envs.locomotion import make_locomotion_env  # noqa: E402
from metalearn.rl.inner import InnerConfig  # noqa: E402
from metalearn.rl.maml_rl import MAMLRLConfig, make_meta_iteration  # noqa: E402
from metalearn.rl.policy import init_policy, policy_apply  # noqa: E402

name = sys.argv[1] if len(sys.argv) > 1 else "cheetah_dir"
iterations = int(sys.argv[2]) if len(sys.argv) > 2 else 40
env = make_locomotion_env(name, horizon=100)
if name == "cheetah_dir":
    env = env._replace(sample_tasks=lambda key, n: jnp.ones((n,), jnp.float32))
cfg = MAMLRLConfig(num_tasks=10, num_post_rollouts=20, inner=InnerConfig(num_steps=0, lrs=()))
init, iteration = make_meta_iteration(env, policy_apply, cfg)
state = init(init_policy(jax.random.key(0), env.obs_dim, env.action_dim))
start = time.time()
for i in range(iterations):
    state, metrics = iteration(state, jax.random.key(100 + i))
    if i % 5 == 0 or i < 3:
        shown = {k: round(float(metrics[k]), 3) for k in ("backtracks", "kl", "post_return")}
        log_std = jnp.round(state.params["log_std"], 3)
        print(i, f"{time.time() - start:.0f}s", shown, "logstd", log_std, flush=True)
