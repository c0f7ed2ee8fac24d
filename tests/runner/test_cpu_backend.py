"""XLA:CPU settings taken before JAX starts: devices per core, the unrolled threefry lowering."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from metalearn.config import Config, DistributedConfig, TrainerConfig
from metalearn.models.conv4 import Conv4Config
from metalearn.models.mlp import MLPConfig
from metalearn.runner.cpu_backend import auto_cpu_devices
from metalearn.runner.experiment import cpu_devices_for
from tests.cli import REPO, checkout_env

SAME_BITS = """
import jax, numpy as np
from metalearn.runner.cpu_backend import unroll_cpu_threefry
def draws(key):
    a, b = jax.random.split(jax.random.fold_in(key, 7))
    return jax.random.uniform(a, (1000,)), jax.random.normal(b, (5, 7)), jax.random.bits(b, (9,))
key = jax.random.key(3)
rolled = jax.jit(lambda k: draws(k))
assert " while" in rolled.lower(key).compile().as_text()
before = jax.device_get(rolled(key))
assert unroll_cpu_threefry()
unrolled = jax.jit(lambda k: draws(k))
assert " while" not in unrolled.lower(key).compile().as_text()
after = jax.device_get(unrolled(key))
for x, y in zip(before, after, strict=True):
    np.testing.assert_array_equal(x, y)
print("same bits")
"""


def test_unrolled_threefry_draws_the_same_bits_without_a_loop():
    result = subprocess.run(
        [sys.executable, "-c", SAME_BITS],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=checkout_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "same bits" in result.stdout


@pytest.mark.parametrize(
    ("convolutional", "meta_batch", "cores", "devices"),
    [(True, 32, 2, 2), (True, 8, 2, 2), (True, 25, 2, 1), (True, 12, 8, 6), (False, 32, 2, 1)],
)
def test_auto_devices_divide_the_meta_batch(convolutional, meta_batch, cores, devices):
    assert auto_cpu_devices(convolutional, meta_batch, cores) == devices


def test_only_auto_batching_of_a_conv_model_asks_for_more_devices():
    def devices(**overrides):
        model = overrides.pop("model", Conv4Config())
        distributed = DistributedConfig(enabled=overrides.pop("distributed", False))
        trainer = TrainerConfig(meta_batch_size=32, **overrides)
        return cpu_devices_for(Config(model=model, trainer=trainer, distributed=distributed), 2)

    assert devices() == 2
    assert devices(task_batching="map") == 1  # the one-device loop, as before
    assert devices(shard_tasks=False) == 1
    assert devices(distributed=True) == 1
    assert devices(model=MLPConfig()) == 1


def test_an_explicit_device_count_wins():
    code = (
        "import jax; from metalearn.runner.cpu_backend import start_cpu_devices; "
        "print(start_cpu_devices(2), jax.device_count())"
    )
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": "3"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=checkout_env(env)
    )
    assert result.stdout.split() == ["False", "3"], result.stderr[-2000:]
    env.pop("JAX_NUM_CPU_DEVICES")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=checkout_env(env)
    )
    assert result.stdout.split() == ["True", "2"], result.stderr[-2000:]
