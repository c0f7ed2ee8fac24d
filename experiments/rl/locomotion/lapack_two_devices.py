"""Four independent batched triangular solves in one jitted call, the batch split over two
XLA:CPU devices (one thread each), called 100 times; prints "completed" unless it deadlocks.
``timeout 60 python lapack_two_devices.py serial`` (with serial LAPACK scheduling) or
``... default`` (without); exit status 124 is a hang."""

import sys

from metalearn.rl.lapack import schedule_lapack_calls_serially
from metalearn.runner.cpu_backend import start_cpu_devices

if sys.argv[1] == "serial":
    assert schedule_lapack_calls_serially()
assert start_cpu_devices(2)  # before JAX's first computation

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.scipy.linalg import solve_triangular  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

mesh = Mesh(jax.devices(), ("tasks",))
split = NamedSharding(mesh, P(None, "tasks"))
a = jnp.tril(jax.random.normal(jax.random.key(0), (4, 512, 64, 64))) + 10 * jnp.eye(64)
b = jax.random.normal(jax.random.key(1), (4, 512, 64, 8))
a, b = jax.device_put(a, split), jax.device_put(b, split)
solves = jax.jit(lambda a, b: [solve_triangular(a[i], b[i], lower=True) for i in range(4)])
for _ in range(100):
    jax.block_until_ready(solves(a, b))
print("completed")
