"""DropBlock (Ghiasi et al., 2018): drop whole square regions of a feature map, not single units.

Constructed as in MetaOptNet's ``models/dropblock.py`` (Lee et al., 2019), which ResNet-12 uses:

1. Block seeds are drawn independently, ``Bernoulli(gamma)``, at every position where a
   ``block_size`` x ``block_size`` square fits inside the map: a seed array of shape
   ``[batch, H - b + 1, W - b + 1, channels]`` (per example and per channel).
2. A seed at ``(i, j)`` drops the square ``[i, i + b) x [j, j + b)`` of the ``H x W`` map; squares
   never leave the map, and overlapping squares drop a position once (:func:`block_mask`).
3. The kept units are rescaled by ``total units / kept units``, counted over the whole tensor
   (batch and channels included), so the output's sum matches the input's sum in expectation.

``gamma`` turns a drop rate (the fraction of units to drop) into a seed rate, as in the paper
and MetaOptNet: ``gamma = rate / b**2 * (H * W) / ((H - b + 1) * (W - b + 1))``, each seed
dropping ``b**2`` units and only ``(H - b + 1) * (W - b + 1)`` positions holding seeds. Squares
overlap, so slightly fewer than ``rate`` of the units are dropped (none overlap on a 5x5 map
with ``b = 5``: there a whole channel map is dropped with probability ``rate``).

A ``block_size`` larger than the map is clipped to the map's smaller side (MetaOptNet's code
would fail there; timm clips the same way). NHWC layout throughout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def clipped_block_size(block_size: int, height: int, width: int) -> int:
    """``block_size``, or the map's smaller side when the block does not fit.

    >>> clipped_block_size(5, 10, 10), clipped_block_size(5, 4, 8)
    (5, 4)
    """
    if block_size < 1:
        raise ValueError(f"DropBlock block_size must be >= 1, got {block_size}")
    return min(block_size, height, width)


def seed_rate(drop_rate: float | jax.Array, block_size: int, height: int, width: int):
    """``gamma``: the Bernoulli rate of block seeds that drops about ``drop_rate`` of the units.

    >>> round(seed_rate(0.1, 5, 5, 5), 6)  # one seed position: gamma is the drop rate
    0.1
    >>> round(seed_rate(0.1, 5, 10, 10), 6)  # 0.1 / 25 * 100 / 36
    0.011111
    """
    b = clipped_block_size(block_size, height, width)
    return drop_rate / b**2 * (height * width) / ((height - b + 1) * (width - b + 1))


def block_mask(seeds: jax.Array, block_size: int) -> jax.Array:
    """The keep mask (1 kept, 0 dropped) of the squares that ``seeds`` start.

    ``seeds``: ``[batch, H - b + 1, W - b + 1, channels]``, nonzero where a square starts.
    Returns ``[batch, H, W, channels]`` float32. A position is dropped when some seed at
    ``(i, j)`` has ``i <= row < i + b`` and ``j <= col < j + b``: a max over a ``b x b`` window of
    the seeds zero-padded by ``b - 1`` on every side.

    >>> import jax.numpy as jnp
    >>> seeds = jnp.zeros((1, 2, 2, 1)).at[0, 1, 0, 0].set(1.0)  # a 3x3 square on a 4x4 map
    >>> block_mask(seeds, 3)[0, :, :, 0].astype(int).tolist()
    [[1, 1, 1, 1], [0, 0, 0, 1], [0, 0, 0, 1], [0, 0, 0, 1]]
    """
    pad = block_size - 1
    dropped = lax.reduce_window(
        (seeds != 0).astype(jnp.float32),
        jnp.zeros((), jnp.float32),
        lax.max,
        (1, block_size, block_size, 1),
        (1, 1, 1, 1),
        ((0, 0), (pad, pad), (pad, pad), (0, 0)),
    )
    return 1.0 - dropped


def drop_block(
    x: jax.Array, key: jax.Array, drop_rate: float | jax.Array, block_size: int
) -> jax.Array:
    """Apply DropBlock to NHWC ``x`` with seeds drawn from ``key`` (training mode).

    Kept units are scaled by ``x.size / kept``; if every unit is dropped the output is zero.

    >>> import jax, jax.numpy as jnp
    >>> x = jnp.ones((8, 10, 10, 16))
    >>> y = drop_block(x, jax.random.key(0), 0.1, 5)
    >>> bool(jnp.isclose(y.mean(), 1.0)), bool((y == 0).any())
    (True, True)
    """
    n, h, w, c = x.shape
    b = clipped_block_size(block_size, h, w)
    gamma = seed_rate(drop_rate, b, h, w)
    seeds = jax.random.bernoulli(key, gamma, (n, h - b + 1, w - b + 1, c))
    mask = lax.stop_gradient(block_mask(seeds, b))
    kept = jnp.sum(mask)
    scale = lax.stop_gradient(mask.size / jnp.maximum(kept, 1.0))
    return x * (mask * scale).astype(x.dtype)
