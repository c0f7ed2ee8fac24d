"""The run plan: what the config, the parts' declarations and the machine decide, once."""

import re

import jax
import pytest

from metalearn.config import to_objects
from metalearn.core import batching as task_batching
from metalearn.registry import TASKS
from metalearn.runner.cpu_backend import prepare_machine
from metalearn.runner.experiment import build
from metalearn.runner.plan import resolve, resolve_steps_per_call, resolve_task_batching
from tests.cli import OMNIGLOT_TINY, RL_TINY, TINY
from tests.conftest import compose_config


def test_cpu_default_batching_is_map_for_conv_models_and_rl_and_vmap_for_dense(monkeypatch):
    """The model declares whether it is convolutional, the family whether its tasks are large;
    parameter shapes say nothing. RL tasks (thousands of policy evaluations each) loop on a
    CPU whatever the policy."""
    monkeypatch.setattr(task_batching.jax, "default_backend", lambda: "cpu")
    assert resolve_task_batching("auto", convolutional=True) == "map"
    assert resolve_task_batching("auto", convolutional=False) == "vmap"
    assert resolve_task_batching("auto", convolutional=False, large_tasks=True) == "map"
    assert resolve_task_batching("unroll", convolutional=True) == "unroll"
    assert resolve_task_batching("vmap", convolutional=False, large_tasks=True) == "vmap"
    monkeypatch.setattr(task_batching.jax, "default_backend", lambda: "gpu")
    assert resolve_task_batching("auto", convolutional=True) == "vmap"
    assert resolve_task_batching("auto", convolutional=False, large_tasks=True) == "vmap"


@pytest.mark.parametrize(
    "overrides, batching, fused",
    [(TINY, "vmap", 100), (OMNIGLOT_TINY, "map", 10), (RL_TINY, "map", 100)],
    ids=["sinusoid", "omniglot-conv4", "rl"],
)
def test_the_plan_reads_what_the_parts_declare(monkeypatch, overrides, batching, fused):
    # Conv4 is registered convolutional, the RL family with large tasks: read from the
    # registry, before anything is built.
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    cfg = to_objects(compose_config([*overrides, "trainer.steps_per_call=0"]))
    plan = resolve(cfg)
    assert plan.config is cfg
    assert (plan.task_batching, plan.steps_per_call) == (batching, fused)
    assert (plan.platform, plan.device_count) == (jax.devices()[0].platform, jax.device_count())


def test_steps_per_call_auto_fuses_100_dense_and_10_convolutional_steps_on_cpu(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    assert resolve_steps_per_call(0, convolutional=False) == 100
    assert resolve_steps_per_call(0, convolutional=True) == 10
    assert resolve_steps_per_call(7, convolutional=True) == 7
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert resolve_steps_per_call(0, convolutional=True) == 100


def test_an_unread_final_rate_is_a_warning_of_the_plan():
    cfg = to_objects(compose_config([*TINY, "optimizer.final_lr_fraction=0.01"]))
    (warning,) = resolve(cfg).warnings
    assert warning.startswith("optimizer.final_lr_fraction=0.01 is unused")


def test_what_a_family_declares_of_the_machine_reaches_the_process_the_plan_and_the_checks(
    monkeypatch,
):
    """A task family declares what its runs need of the machine (the locomotion families:
    serial LAPACK scheduling, a warning and a refusal on several XLA:CPU devices); the runner
    calls each from the family's registry entry, with the plan's batching and devices."""
    info = TASKS.entry("rl_env").info
    prepared = []
    monkeypatch.setitem(info, "prepare_process", lambda cfg: prepared.append(cfg.data.env))
    monkeypatch.setitem(info, "run_warning", lambda cfg, *machine: f"warned {machine}")
    cfg = to_objects(compose_config(RL_TINY))
    prepare_machine(cfg, training=False)
    assert prepared == ["nav2d"]
    plan = resolve(cfg)
    machine = (plan.task_batching, plan.platform, plan.device_count)
    assert plan.warnings == (f"warned {machine}",)
    monkeypatch.setitem(info, "run_refusal", lambda cfg, *machine: f"refused {machine}")
    with pytest.raises(ValueError, match=re.escape(f"refused {machine}")):
        build(plan)
