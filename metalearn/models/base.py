"""The model bundle a meta-learner sees: pure functions of parameters, state and a key.

A :class:`Model` has parameters, mutable state (Flax collections other than ``params``, such as
batch-norm running statistics in ``batch_stats``) and takes a PRNG key on every call (dropout,
DropBlock: Flax's ``'dropout'`` rng). It *declares* its parts rather than having them guessed:
the top-level parameter entries of its head, a method returning the features before the head,
the parameters of its normalisation layers (found by layer type, not by name) and whether it is
convolutional. :func:`model_from_flax` builds one from a Flax module and those declarations.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

PyTree = Any
# apply(params, state, key, x, train, mask=None) -> (outputs, new_state)
Apply = Callable[..., tuple[jax.Array, PyTree]]

# Flax's normalisation layers; a model adds its own through ``norm_layers``.
NORM_LAYERS: tuple[type, ...] = (
    nn.BatchNorm,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.RMSNorm,
    nn.InstanceNorm,
)
# Those that normalise each example on its own; any other normalisation layer is taken to mix
# the examples of a batch (batch statistics), so padding must be masked out of it.
PER_EXAMPLE_NORMS: tuple[type, ...] = (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, nn.InstanceNorm)


class Model(NamedTuple):
    """A model as pure functions.

    - ``init(key) -> (params, state)``; ``state`` is a dict of mutable collections (``{}`` for
      a stateless model).
    - ``apply(params, state, key, x, train=True, mask=None) -> (outputs, new_state)``: in
      training mode the mutable collections are updated (and returned); in evaluation mode
      (``train=False``) they are read (e.g. running statistics) and returned unchanged. ``key``
      feeds the model's randomness (dropout); None for none. ``mask`` (bool ``[batch]``, only
      passed for padded batches) marks the real examples: batch statistics are computed over
      them alone, so padding never changes a real example's output.
    - ``embed``: like ``apply``, returning the features before the head; None if not declared.
    - ``head``: the top-level parameter entries of the final layer (ANIL adapts only those;
      Prototypical Networks replace them).
    - ``norm_paths``: the parameter paths (``"norms_0/scale"``) of normalisation layers.
    - ``is_convolutional``: picks the CPU task batching and the number of fused steps.
    """

    init: Callable[[jax.Array], tuple[PyTree, PyTree]]
    apply: Apply
    embed: Apply | None = None
    head: tuple[str, ...] = ()
    norm_paths: frozenset[str] = frozenset()
    is_convolutional: bool = False


class ModelParts(NamedTuple):
    """What a registered Flax model declares about itself (see :func:`model_from_flax`)."""

    head: str | None = None
    embed: str | None = None
    convolutional: bool = False
    norm_layers: tuple[type, ...] = ()


def stateless(
    init: Callable[[jax.Array], PyTree],
    apply: Callable[[PyTree, jax.Array], jax.Array],
    **declared: Any,
) -> Model:
    """A :class:`Model` from ``init(key) -> params`` and ``apply(params, x) -> outputs``.

    >>> import jax, jax.numpy as jnp
    >>> model = stateless(lambda key: jnp.ones(2), lambda w, x: x @ w)
    >>> params, state = model.init(jax.random.key(0))
    >>> model.apply(params, state, None, jnp.eye(2))
    (Array([1., 1.], dtype=float32), {})
    """

    def apply_fn(params, state, key, x, train=True, mask=None):
        del key, train, mask  # examples are independent: padding changes no real output
        return apply(params, x), state

    return Model(lambda key: (init(key), {}), apply_fn, **declared)


def batch_moments(x: jax.Array, mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Mean and biased variance of ``x`` over every axis but the last (channels), over the
    examples ``mask`` marks (bool ``[batch]``; None: all of them, the plain means). Masked-out
    examples never enter the result, whatever they hold.

    >>> x = jnp.array([[1.0], [3.0], [1e9]])
    >>> [m.tolist() for m in batch_moments(x, jnp.array([True, True, False]))]
    [[2.0], [1.0]]
    >>> [m.tolist() for m in batch_moments(x[:2])]
    [[2.0], [1.0]]
    """
    axes = tuple(range(x.ndim - 1))
    mean, keep, count = _batch_mean(x, mask)
    if keep is None:
        return mean, jnp.mean(jnp.square(x - mean), axis=axes)
    var = jnp.sum(jnp.where(keep, jnp.square(x - mean), 0.0), axis=axes) / count
    return mean, var


def batch_covariance(x: jax.Array, mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Mean ``[c]`` and biased covariance ``[c, c]`` of the last axis of ``x`` over every other
    axis, over the examples ``mask`` marks, as :func:`batch_moments` (whose variance is this
    covariance's diagonal).

    >>> x = jnp.array([[1.0, 2.0], [3.0, 6.0], [1e9, 0.0]])
    >>> [m.tolist() for m in batch_covariance(x, jnp.array([True, True, False]))]
    [[2.0, 4.0], [[1.0, 2.0], [2.0, 4.0]]]
    """
    mean, keep, count = _batch_mean(x, mask)
    centered = x - mean
    kept = centered if keep is None else jnp.where(keep, centered, 0.0)
    channels = x.shape[-1]
    return mean, kept.reshape(-1, channels).T @ centered.reshape(-1, channels) / count


def _batch_mean(x: jax.Array, mask: jax.Array | None) -> tuple[jax.Array, Any, Any]:
    """The mean over every axis but the last, over the examples ``mask`` marks; with ``mask``
    broadcastable against ``x`` (None without a mask) and the count of entries per channel."""
    axes = tuple(range(x.ndim - 1))
    if mask is None:
        return jnp.mean(x, axis=axes), None, x.size // x.shape[-1]
    keep = mask.reshape(mask.shape + (1,) * (x.ndim - 1))
    count = jnp.maximum(jnp.sum(mask), 1) * (x[0].size // x.shape[-1])
    return jnp.sum(jnp.where(keep, x, 0.0), axis=axes) / count, keep, count


def _takes(method: Callable, argument: str) -> bool:
    return argument in inspect.signature(method).parameters


# Other spellings of the train/evaluate switch: metalearn passes ``train`` only, so a method
# taking one of these kept its default, silently (batch norm never updated its running
# averages, or dropout never dropped).
OTHER_TRAIN_FLAGS = ("training", "is_training", "deterministic", "use_running_average", "eval")


def _train_flag_problem(module: nn.Module, method_name: str | None) -> str | None:
    method = getattr(module, method_name) if method_name else module.__call__
    if _takes(method, "train"):
        return None
    other = [f for f in OTHER_TRAIN_FLAGS if _takes(method, f)]
    if not other:
        return None
    return (
        f"{type(module).__name__}.{method_name or '__call__'} takes {other[0]!r}, but metalearn "
        f"passes the mode as 'train' (True while adapting and meta-training, False in "
        f"evaluation), so {other[0]} would keep its default: name the argument train "
        f"(deterministic = not train for dropout, use_running_average = not train for batch norm)"
    )


def module_problem(obj: Any) -> str | None:
    """What ``obj`` is, when it is not a Flax module instance (what :func:`model_from_flax` wraps
    and what a factory registered with ``MODELS`` returns), or None.

    >>> module_problem(nn.Dense(3)) is None, module_problem(nn.Dense)
    (True, 'the class Dense, not an instance of it (Dense(...))')
    """
    if isinstance(obj, nn.Module):
        return None
    if isinstance(obj, type) and issubclass(obj, nn.Module):
        return f"the class {obj.__name__}, not an instance of it ({obj.__name__}(...))"
    if isinstance(obj, Model):
        return (
            "a metalearn Model, not the Flax module itself: return the module; the runner wraps "
            "it (model_from_flax) with the parts its registration declares"
        )
    name = getattr(obj, "__qualname__", None)
    shown = f"a {type(obj).__name__}" + (f" ({name})" if name else "")
    return f"{shown}, not a Flax module (an instance of flax.linen.Module, such as MLP((40,), 1))"


def _norm_layers(
    module: nn.Module, example: jax.Array, layers: tuple[type, ...]
) -> tuple[frozenset, bool]:
    """Parameter paths of the submodules of ``module`` that are instances of ``layers``, and
    whether any of them uses batch statistics (is not one of :data:`PER_EXAMPLE_NORMS`)."""
    found: list[tuple[str, ...]] = []
    batch_statistics = []

    def record(next_fun, args, kwargs, context):
        if isinstance(context.module, layers):
            found.append(tuple(context.module.path))
            batch_statistics.append(not isinstance(context.module, PER_EXAMPLE_NORMS))
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
        shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), example))
    names = set()
    for path, _ in jax.tree_util.tree_leaves_with_path(shapes.get("params", {})):
        keys = tuple(str(p.key) for p in path)
        if any(keys[: len(prefix)] == prefix for prefix in found):
            names.add("/".join(keys))
    return frozenset(names), any(batch_statistics)


def model_from_flax(
    module: nn.Module,
    input_shape: tuple[int, ...],
    parts: ModelParts | None = None,
) -> Model:
    """Wrap a Flax module as a :class:`Model`.

    The module's collections other than ``params`` are its state. Its ``__call__`` (and the
    ``parts.embed`` method) may take a ``train`` argument (Flax's convention; batch norm reads
    running averages when it is false) and may draw from the ``'dropout'`` rng. ``parts``
    declares the head (a top-level parameter entry), the embedding method, whether the model is
    convolutional, and its own normalisation layer types (beyond Flax's :data:`NORM_LAYERS`).

    >>> import jax, jax.numpy as jnp
    >>> from metalearn.models.mlp import MLP
    >>> model = model_from_flax(MLP((8,), 1), (1,), ModelParts(head="head", embed="embed"))
    >>> params, state = model.init(jax.random.key(0))
    >>> model.head, state, model.apply(params, state, None, jnp.ones((3, 1)))[0].shape
    (('head',), {}, (3, 1))
    >>> class Normed(nn.Module):
    ...     @nn.compact
    ...     def __call__(self, x, train: bool = True):
    ...         x = nn.BatchNorm(use_running_average=not train, name="bn")(nn.Dense(2)(x))
    ...         return nn.Dense(1, name="out")(x)
    >>> normed = model_from_flax(Normed(), (3,))
    >>> sorted(normed.norm_paths)
    ['bn/bias', 'bn/scale']
    >>> params, state = normed.init(jax.random.key(0))
    >>> _, trained = normed.apply(params, state, None, jnp.ones((4, 3)) * 2.0, train=True)
    >>> _, same = normed.apply(params, state, None, jnp.ones((4, 3)), train=False)
    >>> bool(jnp.all(trained["batch_stats"]["bn"]["mean"] != 0)), same is state
    (True, True)
    """
    problem = module_problem(module)
    if problem:
        raise ValueError(f"model_from_flax was given {problem}; see docs/extending.md (a model)")
    parts = parts or ModelParts()
    for method_name in (None, parts.embed) if parts.embed else (None,):
        problem = _train_flag_problem(module, method_name)
        if problem:
            raise ValueError(problem)
    example = jnp.zeros((1, *input_shape), jnp.float32)
    norm_paths, batch_statistics = _norm_layers(
        module, example, NORM_LAYERS + tuple(parts.norm_layers)
    )

    def init(key: jax.Array) -> tuple[PyTree, PyTree]:
        variables = dict(module.init(key, example))
        params = variables.pop("params", {})
        return params, variables

    def call(method_name: str | None):
        method = getattr(module, method_name) if method_name else module.__call__
        takes_train, takes_mask = _takes(method, "train"), _takes(method, "mask")

        def apply(params, state, key, x, train=True, mask=None):
            variables = {"params": params, **state}
            rngs = {"dropout": key} if key is not None else {}
            kwargs = {"train": train} if takes_train else {}
            if mask is not None and takes_mask:
                kwargs["mask"] = mask
            elif mask is not None and batch_statistics:
                raise ValueError(
                    f"{type(module).__name__} normalises over the batch but its "
                    f"{method_name or '__call__'} takes no mask, so the padding of variable-way "
                    "or variable-shot episodes would enter its batch statistics; give it a "
                    "`mask` argument (as Conv4 and ResNet12 have) or use fixed ways and shots"
                )
            if train and state:
                outputs, updates = module.apply(
                    variables, x, rngs=rngs, method=method_name, mutable=list(state), **kwargs
                )
                return outputs, {**state, **updates}
            return module.apply(variables, x, rngs=rngs, method=method_name, **kwargs), state

        return apply

    return Model(
        init=init,
        apply=call(None),
        embed=call(parts.embed) if parts.embed else None,
        head=(parts.head,) if parts.head else (),
        norm_paths=norm_paths,
        is_convolutional=parts.convolutional,
    )
