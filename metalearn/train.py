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
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from metalearn.config import check_writable, exit_on_renamed_keys, register_configs, to_objects
from metalearn.runner.devices import initialize_distributed
from metalearn.runner.loop import NonFiniteError, train_and_evaluate

# The Hydra configs ship inside the package (metalearn/conf/), so a wheel install runs too.
CONF_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conf")
log = logging.getLogger("metalearn")

register_configs()
# Orbax reports every save and restore at INFO through absl; keep the run log readable.
logging.getLogger("absl").setLevel(logging.WARNING)


def run(cfg: DictConfig, workdir: str) -> dict:
    """Validate ``cfg``, write it resolved to ``workdir/config.yaml``, train and evaluate."""
    config = to_objects(cfg)
    check_writable(workdir)
    d = config.distributed
    initialize_distributed(d.enabled, d.coordinator_address, d.num_processes, d.process_id)
    with open(os.path.join(workdir, "config.yaml"), "w") as f:
        f.write(OmegaConf.to_yaml(cfg, resolve=True))
    return train_and_evaluate(config, workdir)


@hydra.main(version_base=None, config_path="pkg://metalearn.conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    workdir = HydraConfig.get().runtime.output_dir
    try:
        summary = run(cfg, workdir)
    except (ValueError, FileNotFoundError, NonFiniteError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    if summary["interrupted"]:
        sys.exit(128 + summary["signal"])
    return summary["best_val_score"]


if __name__ == "__main__":
    exit_on_renamed_keys(sys.argv[1:])
    main()
