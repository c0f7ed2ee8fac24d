"""Prepare the few-shot image datasets in TFDS ahead of training.

Optional: a run prepares its dataset on first use. This is for preparing once, e.g. on a login
node before a sweep, or to check that a manual directory is complete. Settings are spelled as
in a run (``data=NAME data.manual_dir=DIR data.data_dir=DIR``):

    python -m metalearn.tools.prepare_data data=omniglot data.manual_dir=../shared/data/omniglot
    python -m metalearn.tools.prepare_data data=cifarfs,fc100 data.manual_dir=~/data/cifar
    python -m metalearn.tools.prepare_data data=miniimagenet data.manual_dir=~/mini-imagenet \\
        data.data_dir=/data/tfds

Names are the ``data=`` choices (omniglot, miniimagenet, cifarfs, fc100; several separated by
commas); ``data.data_dir`` is the TFDS data directory (default ``$TFDS_DATA_DIR`` or
``~/tensorflow_datasets``). Prints each split's array shape; a missing or damaged source, or an
argument it does not know, ends in a one-line error and exit status 2.
"""

from __future__ import annotations

import importlib.resources
import sys
import time

from metalearn.data.cifar_builder import CifarFs, Fc100
from metalearn.data.fewshot_builder import load_split_arrays
from metalearn.data.miniimagenet_builder import MiniImagenetRavi
from metalearn.data.omniglot_builder import OmniglotVinyals
from metalearn.data.sources import DataSourceError, directory_setting_problem

BUILDERS = {
    "omniglot": OmniglotVinyals,
    "miniimagenet": MiniImagenetRavi,
    "cifarfs": CifarFs,
    "fc100": Fc100,
}
USAGE = (
    "python -m metalearn.tools.prepare_data data=NAME[,NAME] [data.manual_dir=DIR] "
    "[data.data_dir=DIR]"
)
KEYS = ("data", "data.manual_dir", "data.data_dir")
DIRECTORIES = {
    "data.manual_dir": "give the directory that holds the downloaded files",
    "data.data_dir": "give a directory for the prepared datasets (created if missing)",
}


def _generated_data() -> list[str]:
    """The ``data=`` options with no dataset to prepare (sinusoid, the RL environments).

    >>> {"sinusoid", "nav2d"} <= set(_generated_data()) and "omniglot" not in _generated_data()
    True
    """
    options = importlib.resources.files("metalearn.conf").joinpath("data").iterdir()
    names = (o.name.removesuffix(".yaml") for o in options if o.name.endswith(".yaml"))
    return sorted(n for n in names if n not in BUILDERS)


def parse_args(argv: list[str]) -> dict[str, str]:
    """``key=value`` arguments as a dict; ValueError for anything else.

    >>> parse_args(["data=omniglot", "data.manual_dir=/d"])
    {'data': 'omniglot', 'data.manual_dir': '/d'}
    >>> parse_args(["--manual-dir", "/d"])
    Traceback (most recent call last):
    ...
    ValueError: unknown argument '--manual-dir'; usage: python -m metalearn.tools.prepare_data ...
    """
    settings = {}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key not in KEYS:
            raise ValueError(f"unknown argument {arg!r}; usage: {USAGE}")
        if key in settings:  # the later one won silently
            raise ValueError(
                f"{key} is given twice ({key}={settings[key]}, {arg}): give it once "
                "(several datasets: data=NAME,NAME)"
            )
        settings[key] = value
    if not settings.get("data"):
        raise ValueError(f"name the dataset(s) with data=; usage: {USAGE}")
    for key, advice in DIRECTORIES.items():
        problem = directory_setting_problem(key, settings[key]) if settings.get(key) else None
        if problem:
            raise ValueError(f"{problem}; {advice}")
    names = settings["data"].split(",")
    without_files = _generated_data()
    generated = [n for n in names if n in without_files]
    if generated:  # it said "unknown sinusoid", which a run takes as data=sinusoid
        raise ValueError(
            f"data={generated[0]} needs no preparation: its tasks are generated as a run "
            f"draws them; this prepares the image datasets ({', '.join(BUILDERS)})"
        )
    unknown = [repr(n) if not n.strip() else n for n in names if n not in BUILDERS]
    if unknown:
        known = ", ".join(BUILDERS)
        raise ValueError(f"data={settings['data']}: unknown {', '.join(unknown)}; known: {known}")
    return settings


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    try:
        settings = parse_args(argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for name in settings["data"].split(","):
        start = time.perf_counter()
        try:
            arrays = load_split_arrays(
                BUILDERS[name],
                data_dir=settings.get("data.data_dir") or None,
                manual_dir=settings.get("data.manual_dir") or None,
            )
        except DataSourceError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        shapes = ", ".join(f"{split} {a.summary()}" for split, a in arrays.items())
        print(f"{name} ({BUILDERS[name].name}): {shapes} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
