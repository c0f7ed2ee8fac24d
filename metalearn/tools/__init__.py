"""Command-line tools that come with the package (a wheel install included), each run as
``python -m metalearn.tools.NAME``:

- ``collect_sweep``: one table of a sweep's ``eval.json`` files;
- ``plot_learning_curves``: training and validation curves from ``metrics.jsonl``;
- ``plot_sinusoid``: MAML's Figure 2 for a sinusoid run;
- ``plot_rl_returns``: the return after 0, 1, 2, 3 inner steps of RL runs (Finn et al. Figure 5);
- ``prepare_data``: build the TFDS datasets ahead of a run (a run also prepares them itself).

Benchmarks, PyTorch peers and the reference implementations stay in the repository's
``scripts/``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from types import ModuleType
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors (a missing argument, an unknown flag) are one ``error:`` line
    ending with the usage on one line, exit status 2; plain argparse prints its usage block
    first.

    >>> parser = OneLineParser(prog="python -m metalearn.tools.x")
    >>> _ = parser.add_argument("run_dir")
    >>> parser.one_line_usage()
    'python -m metalearn.tools.x [-h] run_dir'
    """

    def one_line_usage(self) -> str:
        return " ".join(self.format_usage().split()).removeprefix("usage: ")

    def error(self, message: str) -> NoReturn:
        usage_error(message, self.one_line_usage())


def usage_error(message: str, usage: str) -> NoReturn:
    """A command line its parser refused: one ``error:`` line with the usage, exit status 2
    (:class:`OneLineParser`, and ``metalearn.train`` for the flags Hydra's parser refuses)."""
    print(f"error: {message}; usage: {usage}", file=sys.stderr)
    sys.exit(2)


def exit_status(work: Callable[[], object]) -> int:
    """Run a tool's ``work``: 0 when it finishes; one ``error:`` line and 2 when it raises
    FileNotFoundError or ValueError (a path or a value the user gave).

    >>> exit_status(lambda: None)
    0
    """
    try:
        work()
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def require_matplotlib() -> ModuleType:
    """``matplotlib`` with the file-only Agg backend; one ``error:`` line and exit 2 when it is
    not installed (it is the ``plot`` extra, not a dependency)."""
    try:
        import matplotlib
    except ImportError:
        print("error: the plots need matplotlib: pip install 'metalearn[plot]'", file=sys.stderr)
        sys.exit(2)
    matplotlib.use("Agg")
    return matplotlib
