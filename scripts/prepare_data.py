"""Prepare the few-shot image datasets in TFDS ahead of training.

Optional: a run prepares its dataset on first use. This is for preparing once, e.g. on a login
node before a sweep, or to check that a manual directory is complete.

    python scripts/prepare_data.py omniglot --manual-dir ../shared/data/omniglot
    python scripts/prepare_data.py cifarfs fc100 --manual-dir ~/data/cifar
    python scripts/prepare_data.py miniimagenet --manual-dir ~/mini-imagenet --data-dir /data/tfds

Names are the ``data=`` choices (omniglot, miniimagenet, cifarfs, fc100); ``--data-dir`` is the
TFDS data directory (default ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``), the same as
``data.data_dir`` in a run. Prints each split's array shape; a missing or damaged source ends in
a one-line error and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
import time

from metalearn.data.cifar import CifarFs, Fc100
from metalearn.data.fewshot_builder import load_split_arrays
from metalearn.data.miniimagenet import MiniImagenetRavi
from metalearn.data.omniglot import OmniglotVinyals
from metalearn.data.sources import DataSourceError

BUILDERS = {
    "omniglot": OmniglotVinyals,
    "miniimagenet": MiniImagenetRavi,
    "cifarfs": CifarFs,
    "fc100": Fc100,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", choices=sorted(BUILDERS))
    parser.add_argument("--manual-dir", default=None, help="where the downloaded sources are")
    parser.add_argument("--data-dir", default=None, help="TFDS data directory")
    args = parser.parse_args(argv)
    for name in args.names:
        start = time.perf_counter()
        try:
            arrays = load_split_arrays(
                BUILDERS[name], data_dir=args.data_dir, manual_dir=args.manual_dir
            )
        except DataSourceError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        shapes = ", ".join(f"{split} {a.summary()}" for split, a in arrays.items())
        print(f"{name} ({BUILDERS[name].name}): {shapes} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
