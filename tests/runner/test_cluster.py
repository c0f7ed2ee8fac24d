"""Hydra's submitit launcher: the cluster config composes, and a local submitit sweep runs."""

import subprocess
import sys

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from metalearn.train import CONF_DIR
from tests.cli import checkout_env


def test_slurm_launcher_config_composes():
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(
            config_name="config",
            overrides=["+experiment=sinusoid_maml", "hydra/launcher=cluster"],
            return_hydra_config=True,
        )
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert launcher.gpus_per_node == 1 and launcher.tasks_per_node == 1


def test_sweep_through_submitit_runs_each_job(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "metalearn.train",
            "-m",
            "hydra/launcher=local_cluster",
            "+experiment=sinusoid_maml",
            "+debug=tiny",
            "seed=0,1",
            f"hydra.sweep.dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=checkout_env(),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    runs = sorted(p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert [p.name.split("_")[0] for p in runs] == ["0", "1"]
    assert all((p / "eval.json").exists() for p in runs)
