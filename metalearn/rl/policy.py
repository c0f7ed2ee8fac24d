"""Gaussian MLP policy as plain pytree functions (Finn et al. 2017: two hidden layers of 100
ReLU units, a learned state-independent log standard deviation).

Parameters are ``{"layers": [{"w", "b"}, ...], "log_std": (action_dim,)}``; weights start
Glorot-uniform with zero biases and ``log_std = 0`` (rllab's ``init_std=1``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

Params = Any


def init_policy(
    key: jax.Array, obs_dim: int, action_dim: int, hidden: Sequence[int] = (100, 100)
) -> Params:
    """Glorot-uniform weights, zero biases, zero log-std.

    >>> p = init_policy(jax.random.key(0), 2, 2)
    >>> [layer["w"].shape for layer in p["layers"]], p["log_std"].shape
    ([(2, 100), (100, 100), (100, 2)], (2,))
    """
    sizes = [obs_dim, *hidden, action_dim]
    keys = jax.random.split(key, len(sizes) - 1)
    layers = []
    for k, fan_in, fan_out in zip(keys, sizes[:-1], sizes[1:], strict=True):
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        w = jax.random.uniform(k, (fan_in, fan_out), minval=-limit, maxval=limit)
        layers.append({"w": w, "b": jnp.zeros(fan_out)})
    return {"layers": layers, "log_std": jnp.zeros(action_dim)}


def policy_apply(params: Params, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Mean and log-std of the action distribution at ``obs`` (any leading batch axes).

    >>> p = init_policy(jax.random.key(0), 2, 2)
    >>> mean, log_std = policy_apply(p, jnp.zeros((5, 2)))
    >>> mean.shape, log_std.shape
    ((5, 2), (5, 2))
    """
    h = obs
    *hidden, last = params["layers"]
    for layer in hidden:
        h = jax.nn.relu(h @ layer["w"] + layer["b"])
    mean = h @ last["w"] + last["b"]
    return mean, jnp.broadcast_to(params["log_std"], mean.shape)


def gaussian_log_prob(mean: jax.Array, log_std: jax.Array, action: jax.Array) -> jax.Array:
    """Log-density of a diagonal Gaussian, summed over the last axis.

    >>> round(float(gaussian_log_prob(jnp.zeros(1), jnp.zeros(1), jnp.zeros(1))), 4)
    -0.9189
    """
    z = (action - mean) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * z**2 - log_std - 0.5 * jnp.log(2 * jnp.pi), axis=-1)


def gaussian_entropy(log_std: jax.Array) -> jax.Array:
    """Entropy of a diagonal Gaussian, summed over the last axis.

    >>> round(float(gaussian_entropy(jnp.zeros(1))), 4)
    1.4189
    """
    return jnp.sum(log_std + 0.5 * jnp.log(2 * jnp.pi * jnp.e), axis=-1)


def gaussian_kl(
    mean_p: jax.Array, log_std_p: jax.Array, mean_q: jax.Array, log_std_q: jax.Array
) -> jax.Array:
    """``KL(p || q)`` of diagonal Gaussians, summed over the last axis.

    >>> round(float(gaussian_kl(jnp.zeros(1), jnp.zeros(1), jnp.ones(1), jnp.zeros(1))), 4)
    0.5
    """
    var_p, var_q = jnp.exp(2 * log_std_p), jnp.exp(2 * log_std_q)
    kl = log_std_q - log_std_p + (var_p + (mean_p - mean_q) ** 2) / (2 * var_q) - 0.5
    return jnp.sum(kl, axis=-1)


def sample_action(params: Params, key: jax.Array, obs: jax.Array) -> jax.Array:
    """One action ``mean + std * noise`` (unclipped; the environment clips)."""
    mean, log_std = policy_apply(params, obs)
    return mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
