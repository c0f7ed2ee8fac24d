"""What the locomotion families' runs need of XLA:CPU, declared to the runner by the family:
serial LAPACK scheduling, without which jaxlib 0.10's batched solves deadlock."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from metalearn.config import Config
from metalearn.registry import TASKS
from metalearn.rl.family import RLTasksConfig
from metalearn.rl.lapack import SERIAL_LAPACK_SCHEDULING, needs_serial_lapack
from tests.cli import checkout_env

# Four independent batched triangular solves in one jitted call: with XLA:CPU's default
# scheduler jaxlib 0.10's LAPACK kernels deadlock on them (each splits its batch across the
# intra-op pool and waits for the pieces); under serial LAPACK scheduling the calls complete.
LAPACK_CALLS = """
import jax, jax.numpy as jnp
from jax.scipy.linalg import solve_triangular
from metalearn.rl.lapack import schedule_lapack_calls_serially
assert schedule_lapack_calls_serially()
a = jnp.tril(jax.random.normal(jax.random.key(0), (4, 256, 64, 64))) + 10 * jnp.eye(64)
b = jax.random.normal(jax.random.key(1), (4, 256, 64, 8))
solves = jax.jit(lambda a, b: [solve_triangular(a[i], b[i], lower=True) for i in range(4)])
for _ in range(100):
    jax.block_until_ready(solves(a, b))
print("completed")
"""


def test_serial_lapack_scheduling_lets_concurrent_batched_solves_complete():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    try:
        result = subprocess.run(
            [sys.executable, "-c", LAPACK_CALLS],
            capture_output=True,
            text=True,
            env=checkout_env(env),
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("batched LAPACK calls deadlocked under schedule_lapack_calls_serially()")
    assert result.stdout.split() == ["completed"], result.stderr[-2000:]


def test_runs_on_locomotion_environments_ask_for_serial_lapack_scheduling():
    envs = ("nav2d", "cheetah_dir", "cheetah_vel", "ant_dir")
    assert [needs_serial_lapack(Config(data=RLTasksConfig(env=e))) for e in envs] == [
        False,
        True,
        True,
        True,
    ]
    assert not needs_serial_lapack(Config())  # sinusoid: no LAPACK call in its programs


def test_the_family_asks_a_locomotion_runs_process_for_serial_scheduling(monkeypatch):
    prepare = TASKS.entry("rl_env").info["prepare_process"]  # what the runner calls
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    prepare(Config(data=RLTasksConfig(env="nav2d")))
    assert "XLA_FLAGS" not in os.environ
    prepare(Config(data=RLTasksConfig(env="ant_dir")))
    assert os.environ["XLA_FLAGS"] == SERIAL_LAPACK_SCHEDULING
