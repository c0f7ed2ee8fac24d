"""Plain TRPO (no inner step), every task forward, the mean layer started at HEAD_SCALE x Glorot,
10 tasks x 20 rollouts x 100 steps per iteration split over two XLA:CPU devices (compare
../../cheetah_dir_cpu_2dev/probes/forward_only_trpo.py: the paper's initialisation, one device).
``python forward_only_trpo_small_head.py HEAD_SCALE ITERATIONS``; output:
forward_only_trpo_small_head.txt."""

import sys
import time

from metalearn.rl.lapack import schedule_lapack_calls_serially
from metalearn.runner.cpu_backend import start_cpu_devices

schedule_lapack_calls_serially()  # before JAX's first computation
start_cpu_devices(2)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from metalearn.rl.envs.locomotion import make_locomotion_env  # noqa: E402
from metalearn.rl.inner import InnerConfig  # noqa: E402
from metalearn.rl.maml_rl import MAMLRLConfig, collect_meta_batch, outer_update  # noqa: E402
from metalearn.rl.policy import init_policy, policy_apply  # noqa: E402
from metalearn.runner.devices import TASK_AXIS, shard_task_axis  # noqa: E402

scale = float(sys.argv[1])
iterations = int(sys.argv[2])
env = make_locomotion_env("cheetah_dir", horizon=100)
cfg = MAMLRLConfig(num_tasks=10, num_post_rollouts=20, inner=InnerConfig(num_steps=0, lrs=()))
mesh = Mesh(jax.devices()[:2], (TASK_AXIS,))
params = init_policy(jax.random.key(0), env.obs_dim, env.action_dim)
params["layers"][-1]["w"] = params["layers"][-1]["w"] * scale


@jax.jit
def iteration(params, key):
    keys = shard_task_axis(jax.random.split(key, cfg.num_tasks), mesh)
    tasks = shard_task_axis(jnp.ones((cfg.num_tasks,), jnp.float32), mesh)
    batch = collect_meta_batch(env, policy_apply, cfg, params, keys, tasks)
    params, _, metrics = outer_update(policy_apply, cfg, params, (), optax.identity(), batch)
    return params, metrics


start = time.time()
for i in range(iterations):
    params, m = iteration(params, jax.random.key(100 + i))
    if i % 10 == 0 or i < 3:
        shown = f"{float(m['post_return']):.2f} kl {float(m['kl']):.4f}"
        print(i, f"{time.time() - start:.0f}s", shown, "logstd", jnp.round(params["log_std"], 2))
