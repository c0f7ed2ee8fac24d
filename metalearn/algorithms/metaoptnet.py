"""MetaOptNet-SVM (Lee, Maji, Ravichandran and Soatto 2019): a multi-class linear SVM head.

For each task, a Crammer-Singer multi-class SVM is fitted on the support embeddings
(``model.embed``) by solving its dual quadratic program, as the reference code
(kjunelee/MetaOptNet, ``models/classification_heads.py``, ``MetaOptNetHead_SVM_CS``) states it::

    min_alpha  1/2 sum_k alpha[:, k]^T (K + I) alpha[:, k] - sum_ik Y_ik alpha_ik
    s.t.       alpha_ik <= C Y_ik,   sum_k alpha_ik = 0          (every support example i)

with ``K`` the support Gram matrix, ``Y`` the one-hot labels and ``C = 0.1``; the identity is
the reference's ridge on the block kernel (it makes the problem strongly convex). The class
weights are ``w_k = sum_i alpha_ik x_i`` and a query's logits ``scale * x_q . w_k``, with a
meta-learned ``scale`` (initialised at 1, as the reference's ``ClassificationHead``). The outer
loop trains the embedding (and the scale) on the query cross-entropy, differentiating through
the solution implicitly.

The solver works on the structure: the Hessian is ``(K + I)`` per class column (``n x n`` for
``n`` support examples, never the ``n*ways`` square), and each example's constraints say that
``C Y_i - alpha_i`` lies in the simplex of radius ``C``, onto which a projection is a sort. It is
an accelerated projected gradient method (FISTA with gradient restart) run until the relative
fixed-point (KKT) residual ``max |alpha - proj(alpha - grad / L)| / C`` is below ``tolerance``
or ``iterations`` are spent. Its gradient is implicit (``jax.custom_vjp``): on the free
coordinates the KKT conditions are linear, and the adjoint system ``P (K + I) P u = P v``
(``P`` the projection onto the directions the active bounds and the sum constraint leave free)
is solved by conjugate gradients. See experiments/benchmarks/metaoptnet_svm_head.md for the
measurements behind this choice (against qpax's interior point method).

Padded episodes (:class:`~metalearn.data.task.WeightedBatch`, label ``-1``, weight 0) work: a
padding row has no one-hot label, so its constraints force its ``alpha`` to zero and it never
enters a class weight. As in Prototypical Networks, a class is a label below the support-set
size (a static bound on the ways), and classes absent from the support set get their ``alpha``
fixed at zero and logit ``-inf``. The dual has ``n x classes`` variables, so with many shots
``algorithm.max_ways`` (the episodes' ways, or more) saves the solver work on the absent ones:
a label at or above it would be dropped (its example treated as padding).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import ClassVar

import jax
import jax.numpy as jnp

from metalearn.algorithms.base import MetaLearner, with_config
from metalearn.algorithms.embedding import (
    check_classification,
    dense_head,
    embedding_model,
    features,
    query_classifier,
)
from metalearn.core.curvature import cg_solve
from metalearn.data.task import (
    Objective,
    Task,
    WeightedBatch,
)
from metalearn.registry import ALGORITHMS


@dataclasses.dataclass
class MetaOptNetSVMConfig:
    """MetaOptNet-SVM's settings: the SVM's ``c``, the dual solver's most steps and stopping
    tolerance (relative KKT residual), the implicit gradient's most conjugate-gradient steps and
    the logit scale's initial value."""

    # Read in training only (metalearn.evaluate refuses them as overrides).
    TRAINING_ONLY: ClassVar[Mapping[str, str]] = {
        "label_smoothing": "it smooths the training loss' labels",
        "scale_init": "it initialises the learned scale; the evaluation uses the checkpoint's",
    }

    name: str = "metaoptnet_svm"
    c: float = 0.1  # the SVM's C (reference C_reg = 0.1)
    iterations: int = 5000  # most accelerated projected-gradient steps per task
    tolerance: float = 1e-6  # relative KKT residual at which the solver stops
    backward_iterations: int = 500  # most conjugate-gradient steps of the implicit gradient
    scale_init: float = 1.0  # the meta-learned logit scale's start (reference: 1.0)
    max_ways: int = 0  # classes are the labels below it; 0: below the support-set size
    # The training loss's label smoothing over the episode's classes (reference: --eps, 0.1 on
    # miniImageNet); the metrics report the plain cross-entropy.
    label_smoothing: float = 0.0

    def __post_init__(self) -> None:
        for field, rule, ok in (
            ("c", "> 0", self.c > 0),
            ("iterations", ">= 1", self.iterations >= 1),
            ("tolerance", ">= 0", self.tolerance >= 0),
            ("backward_iterations", ">= 1", self.backward_iterations >= 1),
            ("max_ways", ">= 0 (0: the support-set size)", self.max_ways >= 0),
            ("label_smoothing", "in [0, 1)", 0 <= self.label_smoothing < 1),
        ):
            if not ok:
                raise ValueError(
                    f"algorithm.{field} of metaoptnet_svm must be {rule}, "
                    f"got {getattr(self, field)}"
                )


# --- the dual QP ------------------------------------------------------------------------------


def project_rows(z: jax.Array, radius: jax.Array, mask: jax.Array) -> jax.Array:
    """Each row of ``z`` projected onto ``{b >= 0, sum b = radius, b = 0 off mask}`` (sort).

    >>> import jax.numpy as jnp
    >>> z, keep = jnp.array([[0.5, 0.2, 3.0]]), jnp.array([True, True, False])
    >>> [round(b, 4) for b in project_rows(z, jnp.array([1.0]), keep)[0].tolist()]
    [0.65, 0.35, 0.0]
    """
    lowest = jnp.min(jnp.where(mask, z, jnp.inf), axis=-1, keepdims=True)
    z = jnp.where(mask, z, lowest - radius[:, None] - 1.0)  # below any threshold: projected to 0
    ordered = -jnp.sort(-z, axis=-1)
    cumulative = jnp.cumsum(ordered, axis=-1) - radius[:, None]
    count = jnp.arange(1, z.shape[-1] + 1, dtype=z.dtype)
    kept = jnp.sum(ordered - cumulative / count > 0, axis=-1, keepdims=True)
    kept = jnp.maximum(kept, 1)
    threshold = jnp.take_along_axis(cumulative, kept - 1, axis=-1) / kept.astype(z.dtype)
    return jnp.where(mask, jnp.maximum(z - threshold, 0.0), 0.0)


def _project_dual(alpha, bound, radius, present):
    """The feasible point nearest ``alpha``: ``alpha_i <= bound_i``, ``sum_k alpha_ik = 0``."""
    return bound - project_rows(bound - alpha, radius, present)


def _solve(gram, onehot, c, iterations, tolerance):
    """``(alpha, residual, steps)`` by FISTA with gradient restart on the dual."""
    dtype = gram.dtype
    present = jnp.sum(onehot, axis=0) > 0
    bound = c * onehot
    radius = c * jnp.sum(onehot, axis=1)
    hessian = gram + jnp.eye(gram.shape[0], dtype=dtype)
    lipschitz = jnp.linalg.eigvalsh(hessian)[-1]
    project = functools.partial(_project_dual, bound=bound, radius=radius, present=present)

    def step(point):
        return project(point - (hessian @ point - onehot) / lipschitz)

    def residual(alpha):
        return jnp.max(jnp.abs(alpha - step(alpha))) / c

    def cond(carry):
        _, _, _, i, res = carry
        return (i < iterations) & (res > tolerance)

    def body(carry):
        alpha, point, t, i, _ = carry
        new = step(point)
        t_new = (1.0 + jnp.sqrt(1.0 + 4.0 * t * t)) / 2.0
        restart = jnp.sum((point - new) * (new - alpha)) > 0
        momentum = jnp.where(restart, 0.0, (t - 1.0) / t_new)
        t_new = jnp.where(restart, jnp.ones_like(t), t_new)
        return new, new + momentum * (new - alpha), t_new, i + 1, residual(new)

    start = jnp.zeros_like(onehot)
    one = jnp.ones((), dtype)
    init = (start, start, one, jnp.zeros((), jnp.int32), jnp.asarray(jnp.inf, dtype))
    alpha, _, _, steps, res = jax.lax.while_loop(cond, body, init)
    return alpha, res, steps


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def svm_dual(gram, onehot, c, iterations, tolerance, backward_iterations):
    """``(alpha [n, classes], residual, steps)``: the Crammer-Singer dual's solution for the Gram
    matrix ``gram [n, n]`` and one-hot labels ``onehot [n, classes]`` (a zero row: padding, its
    alpha is 0; a zero column: an absent class, its alpha is 0), the relative KKT residual
    reached and the solver steps taken. Differentiable in ``gram`` (implicitly)."""
    return _solve(gram, onehot, c, iterations, tolerance)


def _svm_dual_fwd(gram, onehot, c, iterations, tolerance, backward_iterations):
    out = _solve(gram, onehot, c, iterations, tolerance)
    return out, (gram, onehot, out[0])


def _svm_dual_bwd(c, iterations, tolerance, backward_iterations, saved, cotangents):
    gram, onehot, alpha = saved
    v = cotangents[0]
    # Free coordinates: a present class whose bound is not active (alpha exactly at the bound
    # is the projection's output 0, so the comparison is exact).
    free = (jnp.sum(onehot, axis=0) > 0)[None, :] & (c * onehot - alpha > 0)
    free = free.astype(gram.dtype)
    counts = jnp.maximum(jnp.sum(free, axis=1, keepdims=True), 1.0)

    def tangent(z):  # projection onto the directions the active constraints leave free
        z = z * free
        return free * (z - jnp.sum(z, axis=1, keepdims=True) / counts)

    def operator(z):
        z = tangent(z)
        return tangent(gram @ z + z)

    rhs = tangent(v)
    # To the dtype's rounding level; a zero-curvature step (exact convergence early) ends it.
    tol = 10 * float(jnp.finfo(rhs.dtype).eps)
    u = cg_solve(operator, rhs, max_iters=backward_iterations, tol=tol).x
    u = tangent(u)
    return -u @ alpha.T, jnp.zeros_like(onehot)


svm_dual.defvjp(_svm_dual_fwd, _svm_dual_bwd)


def svm_logits(
    support_embeddings: jax.Array,
    onehot: jax.Array,
    query_embeddings: jax.Array,
    scale: jax.Array,
    config: MetaOptNetSVMConfig,
) -> tuple[jax.Array, jax.Array]:
    """``(logits [queries, classes], residual)``: ``scale * x_q . w_k`` of the fitted SVM, ``-inf``
    for a class absent from the support set; the relative KKT residual the solver reached."""
    alpha, residual = class_weights_dual(support_embeddings, onehot, config)
    weights = alpha.T @ support_embeddings
    logits = scale * (query_embeddings @ weights.T)
    present = jnp.sum(onehot, axis=0) > 0
    return jnp.where(present[None, :], logits, -jnp.inf), residual


def class_weights_dual(support_embeddings, onehot, config: MetaOptNetSVMConfig):
    """``(alpha, residual)`` of the SVM on these support embeddings and one-hot labels."""
    gram = support_embeddings @ support_embeddings.T
    alpha, residual, _ = svm_dual(
        gram,
        onehot.astype(gram.dtype),
        config.c,
        config.iterations,
        config.tolerance,
        config.backward_iterations,
    )
    return alpha, residual


# --- the learner ------------------------------------------------------------------------------


CLASSES = "to fit an SVM to"  # what metaoptnet_svm does with a task's classes


def _onehot(batch, num_classes: int, dtype) -> jax.Array:
    """One-hot labels; a padding row (label -1, or weight 0) is a zero row."""
    onehot = jax.nn.one_hot(batch[1], num_classes, dtype=dtype)
    if isinstance(batch, WeightedBatch):
        onehot = onehot * (batch.weights > 0).astype(dtype)[:, None]
    return onehot


@ALGORITHMS.register("metaoptnet_svm", MetaOptNetSVMConfig)
def metaoptnet_svm(
    objective: Objective, config: MetaOptNetSVMConfig | None = None, **overrides
) -> MetaLearner:
    """MetaOptNet-SVM on the model's declared embedding; the meta-parameters are
    ``{"params": model parameters, "scale": the logit scale}``.

    ``adapt`` returns the model parameters with the head replaced by the fitted SVM (kernel
    ``scale * w_k``, bias 0, ``-inf`` for an absent class), so the model's ``apply`` predicts
    like the SVM; this needs a declared head of one Dense entry (``kernel [dim, ways]``,
    ``bias [ways]``) fed by the embedding.

    >>> import jax, jax.numpy as jnp
    >>> from metalearn.algorithms.base import context
    >>> from metalearn.data.task import Task, supervised_objective
    >>> from metalearn.models.base import ModelParts, model_from_flax
    >>> from metalearn.models.mlp import MLP
    >>> model = model_from_flax(MLP((32, 16), 3), (4,), ModelParts(head="head", embed="embed"))
    >>> learner = metaoptnet_svm(supervised_objective(model, "classification"))
    >>> params, state = model.init(jax.random.key(1))
    >>> meta, ctx = learner.init(jax.random.key(0), params), context(state)
    >>> x = jax.random.normal(jax.random.key(2), (12, 4))
    >>> labels = jnp.tile(jnp.arange(3), 4)
    >>> task = Task(support=(x[:6], labels[:6]), query=(x[6:], labels[6:]))
    >>> grads, aux = jax.jit(learner.task_grad)(meta, task, ctx)
    >>> sorted(aux.metrics), sorted(grads)
    (['accuracy', 'loss', 'svm_residual'], ['params', 'scale'])
    """
    c = with_config(MetaOptNetSVMConfig, config, overrides)
    model = embedding_model(objective, "metaoptnet_svm")

    def init(key, model_params):
        del key
        return {"params": model_params, "scale": jnp.asarray(c.scale_init, jnp.float32)}

    def embed(params, batch, ctx, stream, train):
        use = "to fit the SVM on"
        return features(model, params, ctx, batch, stream, train, "metaoptnet_svm", use)

    def logits_and_state(meta, task: Task, ctx, train=True):
        check_classification(task.support, "metaoptnet_svm", CLASSES)
        check_classification(task.query, "metaoptnet_svm", CLASSES)
        params = meta["params"]
        support, _ = embed(params, task.support, ctx, 0, train)
        query, state = embed(params, task.query, ctx, 1, train)
        num_classes = c.max_ways or task.support[1].shape[0]
        onehot = _onehot(task.support, num_classes, support.dtype)
        logits, residual = svm_logits(support, onehot, query, meta["scale"], c)
        return logits, state, {"svm_residual": residual}

    task_grad, evaluate = query_classifier(logits_and_state, c.label_smoothing)

    def adapt_params(meta, support, ctx, inner_steps=0):
        del inner_steps  # no inner loop
        check_classification(support, "metaoptnet_svm", CLASSES)
        params = meta["params"]
        written = "metaoptnet_svm's adapt writes the SVM into the head"
        head, num_classes = dense_head(model, params, written)
        x, _ = embed(params, support, ctx, 0, False)
        onehot = _onehot(support, num_classes, x.dtype)
        alpha, _ = class_weights_dual(x, onehot, c)
        kernel = meta["scale"] * (x.T @ alpha)
        bias = jnp.where(jnp.sum(onehot, axis=0) > 0, 0.0, -jnp.inf).astype(kernel.dtype)
        return {**params, head: {"kernel": kernel, "bias": bias}}

    return MetaLearner(init, task_grad, evaluate, adapt_params)
