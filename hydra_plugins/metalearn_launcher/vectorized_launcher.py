"""``hydra/launcher=vectorized``: a sweep's runs grouped into compiled programs, each group one
program that trains all its runs at once (a runs axis), in this process.

    python -m metalearn.train -m +experiment=sinusoid_maml seed=0,1,2,3 \\
        algorithm.inner_lr=0.001,0.003 hydra/launcher=vectorized

Jobs fall into one group when their configs differ only in what the compiled step takes as
data (the seed, ``optimizer.lr``, the algorithm's hyperparameters:
:func:`metalearn.runner.plan.program_key`); other jobs (another model, dataset, step count)
form other groups, run one after another. ``hydra.launcher.max_runs_per_program`` bounds a
group. Each run keeps its own directory and records (config.yaml, .hydra/, metrics.jsonl,
checkpoints/, best/, eval.json, summary.json, status.json, train.log), exactly as a job of
Hydra's basic launcher writes them.
"""

# No "from __future__ import annotations": Hydra loads plugin modules outside sys.modules, where
# a dataclass cannot resolve string annotations.

import dataclasses
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from metalearn.cli import command_line_record

log = logging.getLogger("metalearn")


@dataclasses.dataclass
class VectorizedLauncherConf:
    _target_: str = "hydra_plugins.metalearn_launcher.vectorized_launcher.VectorizedLauncher"
    max_runs_per_program: int = 32  # the most runs one compiled program trains at once


ConfigStore.instance().store(
    group="hydra/launcher", name="vectorized", node=VectorizedLauncherConf, provider="metalearn"
)


@dataclasses.dataclass
class _Job:
    index: int
    overrides: list[str]
    config: DictConfig  # the composed config, without its hydra section
    files: dict[str, str]  # its record of its command line (metalearn.cli.command_line_record)
    workdir: str
    choices: dict  # the config group chosen for each group (Hydra's runtime.choices)


class VectorizedLauncher(Launcher):
    def __init__(self, max_runs_per_program: int = 32) -> None:
        if max_runs_per_program < 1:
            raise ValueError(
                f"hydra.launcher.max_runs_per_program must be >= 1, got {max_runs_per_program}"
            )
        self.max_runs = max_runs_per_program
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config, self.hydra_context = config, hydra_context

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        from metalearn.sweep import run_vectorized

        setup_globals()
        assert self.config is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        count = len(job_overrides)
        log.info("launching %d jobs in compiled programs of up to %d runs", count, self.max_runs)
        jobs = [self._job(initial_job_idx + i, list(o)) for i, o in enumerate(job_overrides)]
        scores = run_vectorized(jobs, str(self.config.hydra.sweep.dir), self.max_runs)
        returns = []
        for job, score in zip(jobs, scores, strict=True):
            ret = JobReturn(overrides=job.overrides, cfg=job.config)
            ret.status, ret.return_value = JobStatus.COMPLETED, score
            ret.working_dir = os.getcwd()
            returns.append(ret)
        return returns

    def _job(self, index: int, overrides: list[str]) -> _Job:
        """A job's composed config and its run directory, as Hydra's basic launcher makes them."""
        config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(config):
            config.hydra.job.id = index
            config.hydra.job.num = index
        HydraConfig.instance().set_config(config)
        workdir = os.path.join(
            str(OmegaConf.select(config, "hydra.sweep.dir")),
            str(OmegaConf.select(config, "hydra.sweep.subdir")),
        )
        with read_write(config.hydra.runtime), open_dict(config.hydra.runtime):
            config.hydra.runtime.output_dir = os.path.abspath(workdir)
        HydraConfig.instance().set_config(config)
        log.info("\t#%d : %s", index, " ".join(filter_overrides(overrides)))
        task = OmegaConf.masked_copy(config, [k for k in config if k != "hydra"])
        files = command_line_record(task)
        choices = OmegaConf.to_container(config.hydra.runtime.choices)
        return _Job(index, overrides, task, files, os.path.abspath(workdir), choices)
