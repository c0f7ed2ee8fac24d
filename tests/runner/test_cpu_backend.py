"""XLA:CPU settings taken before JAX starts: devices per core, one thread each."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from metalearn.config import Config, DistributedConfig, TrainerConfig
from metalearn.models.conv4 import Conv4Config
from metalearn.models.mlp import MLPConfig
from metalearn.runner.cpu_backend import auto_cpu_devices, cpu_devices_for
from tests.cli import checkout_env


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
