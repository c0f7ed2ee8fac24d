"""Shared fixtures: composing configs the way `python -m metalearn.train` does."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import tempfile

# One persistent XLA compilation cache for the whole suite (subprocesses inherit it): the many
# tiny runs compile the same meta-steps, and reusing them keeps the suite within minutes.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "metalearn-tests-jax-cache")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# The tests check results, not speed. XLA's cheapest optimisation level halves compile times
# (second-order convolution meta-steps compile for tens of seconds on 2 CPU cores otherwise), and
# its older CPU fusion emitters take 30-40% off what is left (experiments/benchmarks/README.md).
# XLA refuses a flag it does not know: if a later jaxlib drops this one, drop it here.
os.environ.setdefault(
    "XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
)

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from metalearn import registry
from metalearn.config import SCHEMA_SUFFIX
from metalearn.train import CONF_DIR

# Runnable experiments; base_*.yaml hold what several experiments share and are not run alone.
EXPERIMENTS = sorted(
    f[: -len(".yaml")]
    for f in os.listdir(os.path.join(CONF_DIR, "experiment"))
    if f.endswith(".yaml") and not f.startswith("base_")
)


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def _copy_dicts(tree):
    """``tree`` with every nested dict copied and every other value shared."""
    return {k: _copy_dicts(v) if isinstance(v, dict) else v for k, v in tree.items()}


@pytest.fixture(autouse=True)
def registrations_stay_in_their_test():
    """What a test registers (an algorithm in docs/extending.md's examples, a plugin, an
    environment) is gone after it, with the options ``register_configs`` stored for it, so no
    test sees another's parts whatever the order. Parts registered at import stay."""
    from hydra.core.config_store import ConfigStore

    from metalearn.rl.envs import base as envs

    entries = {group: dict(reg._entries) for group, reg in registry.GROUPS.items()}
    other_parts = _copy_dicts(registry.OTHER_PARTS)
    env_tables = [(table, dict(table)) for table in (envs.ENVS, envs.BATCHED_LINALG_ENVS)]
    yield
    for table, before in env_tables:
        table.clear()
        table.update(before)
    repo = ConfigStore.instance().repo
    for group, reg in registry.GROUPS.items():
        reg._entries.clear()
        reg._entries.update(entries[group])
        for option in list(repo.get(group, {})):
            name = option.removesuffix(".yaml").removesuffix(SCHEMA_SUFFIX)
            if name not in entries[group]:
                del repo[group][option]
    registry.OTHER_PARTS.clear()
    registry.OTHER_PARTS.update(other_parts)


def compose_config(overrides: list[str]) -> DictConfig:
    """Compose like the CLI (Hydra resolvers included), return the config without `hydra`."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        with open_dict(cfg):
            del cfg["hydra"]
        OmegaConf.resolve(cfg)
    return cfg


def experiment_of(cfg):
    """The built experiment of a config, as the runner builds it."""
    from metalearn.runner import build, resolve

    return build(resolve(cfg))


def runner_of(cfg, workdir):
    """The runner of a config in ``workdir``, as the training loop and evaluate build it."""
    from metalearn.runner.run import Runner
    from metalearn.runner.rundir import RunDirectory

    return Runner(experiment_of(cfg), RunDirectory(str(workdir), cfg))


@dataclasses.dataclass(frozen=True)
class FinishedRun:
    """A finished tiny sinusoid run (``+experiment=sinusoid_maml +debug=tiny``, 4 meta-steps)."""

    path: pathlib.Path
    composed: DictConfig  # what the command line composes, saved as its config.yaml
    summary: dict


@pytest.fixture(scope="session")
def finished_tiny_run(tmp_path_factory) -> FinishedRun:
    """One finished tiny run per test process, for the tests that only read a run; a test that
    changes a run works on :func:`copy_of` it."""
    from metalearn.config import to_objects
    from metalearn.runner.loop import train_and_evaluate

    composed = compose_config(["+experiment=sinusoid_maml", "+debug=tiny"])
    path = tmp_path_factory.mktemp("finished") / "run"
    summary = train_and_evaluate(to_objects(composed), str(path))
    OmegaConf.save(composed, path / "config.yaml")  # as the command line writes it
    return FinishedRun(path, composed, summary)


def copy_of(run: FinishedRun, where: pathlib.Path) -> pathlib.Path:
    """A copy of ``run``'s directory at ``where``, to change."""
    shutil.copytree(run.path, where)
    return where


def restore_latest_state(run_dir, cfg=None):
    """The latest checkpointed TrainState of a run (``cfg`` defaults to its config.yaml)."""
    from metalearn.config import to_objects
    from metalearn.runner.checkpoints import CheckpointStore

    if cfg is None:
        cfg = to_objects(OmegaConf.load(os.path.join(run_dir, "config.yaml")))
    store = CheckpointStore(os.path.join(run_dir, "checkpoints"), 2)
    state, _ = store.restore(experiment_of(cfg).initial_state)
    store.close()
    return state
