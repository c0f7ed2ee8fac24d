"""Hydra entry point: ``python -m metalearn.train +experiment=NAME [key=value ...]``.

Everything lands in the Hydra run directory (``outputs/<name>/<time>/`` by default, or
``multirun/...`` with ``-m``): the resolved ``config.yaml``, ``metrics.jsonl``, TensorBoard
events, orbax checkpoints and ``eval.json``. Rerunning with ``hydra.run.dir=<that directory>``
resumes from its latest checkpoint.
"""

from __future__ import annotations

import logging
import os
import sys

import hydra
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from metalearn.config import check_group_choices, check_writable, register_configs, to_objects
from metalearn.data.sources import DataSourceError
from metalearn.runner.compilation_cache import enable_compilation_cache
from metalearn.runner.devices import initialize_distributed
from metalearn.runner.loop import NonFiniteError, train_and_evaluate

CONF_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")
log = logging.getLogger("metalearn")

register_configs()
# Orbax reports every save and restore at INFO through absl, and JAX opens every run with an
# INFO line about the TPU backend it did not find; keep the run log readable.
for _name in ("absl", "jax._src.xla_bridge"):
    logging.getLogger(_name).setLevel(logging.WARNING)


def run(cfg: DictConfig, workdir: str) -> dict:
    """Validate ``cfg``, write it resolved to ``workdir/config.yaml``, train and evaluate."""
    config = to_objects(cfg)
    enable_compilation_cache(config.trainer.compilation_cache)  # before any computation
    check_writable(workdir)
    d = config.distributed
    initialize_distributed(d.enabled, d.coordinator_address, d.num_processes, d.process_id)
    path = os.path.join(workdir, "config.yaml")
    partial = f"{path}.{os.getpid()}.tmp"  # never a half-written config.yaml (one per host)
    with open(partial, "w") as f:
        f.write(OmegaConf.to_yaml(cfg, resolve=True))
    os.replace(partial, path)
    return train_and_evaluate(config, workdir)


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> float | None:
    hydra_cfg = HydraConfig.get()
    workdir = hydra_cfg.runtime.output_dir
    try:
        check_group_choices(hydra_cfg.runtime.choices, _group_options())
        summary = run(cfg, workdir)
    except (ValueError, FileNotFoundError, NonFiniteError, DataSourceError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    if summary["interrupted"]:
        sys.exit(128 + summary["signal"])
    return summary["best_val_score"]


def _group_options() -> dict[str, list[str]]:
    """The options of each config group, as Hydra sees them (schema entries included)."""
    loader = GlobalHydra.instance().config_loader()
    return {g: loader.get_group_options(g) for g in ("algorithm", "model", "data")}


if __name__ == "__main__":
    main()
