"""Hydra callbacks of ``metalearn.train`` (conf/config.yaml lists them)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from metalearn.runner.layout import check_outside_stores, check_writable
from metalearn.runner.sweeps import summarize


class RunDirectoryGuard(Callback):
    """Refuse a run (or sweep) directory inside another run's store, or one that cannot be
    written, before Hydra creates it: one ``error:`` line, exit 2."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        HydraConfig.instance().set_config(config)  # as the job will: run_name needs it
        self._check(str(config.hydra.run.dir), "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(str(config.hydra.sweep.dir), "hydra.sweep.dir")

    def _check(self, directory: str, key: str) -> None:
        try:
            check_outside_stores(directory, key)
            check_writable(directory)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)


class SweepSummary(Callback):
    """After a sweep, list its failed jobs and exit 1 if there were any, so the shell sees it."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._start = time.time() - 1.0  # file times have coarse resolution on some systems

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        lines, any_failed = summarize(Path(str(config.hydra.sweep.dir)), self._start)
        print("\n".join(lines), file=sys.stderr if any_failed else sys.stdout)
        if any_failed:
            sys.exit(1)
