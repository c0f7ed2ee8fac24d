"""What every side of ``scripts/bench.py`` shares, in the standard library only: the PyTorch
peers run in environments without JAX (parallel-metalearn's own, whose top-level ``metalearn``
package would clash with ours), so these cannot live in ``bench_jax``."""

from __future__ import annotations

import resource

MB = 1024.0 * 1024.0
OMNIGLOT_TRAIN_SHAPE = (4112, 20, 28, 28, 1)  # 1028 characters x 4 rotations, 20 drawings


def rss_peak_mb() -> float:
    """The process's peak resident set size so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
