"""R2D2 (Bertinetto, Henriques, Torr and Vedaldi 2019, "Meta-learning with differentiable
closed-form solvers"): a ridge-regression head solved in closed form on each episode.

On the support embeddings ``X [n, d]`` (``model.embed``) and one-hot targets ``Y [n, ways]``
the head is ``W = (X^T X + lambda I)^-1 X^T Y`` (the primal form, a ``d x d`` system) or, by
the Woodbury identity, ``W = X^T (X X^T + lambda I)^-1 Y`` (the dual form, ``n x n``: the
paper's case, shots x ways much smaller than the features). The query logits are
``scale * X_q W + bias``; ``scale``, ``bias`` and ``lambda`` (as ``log_lambda``) are
meta-parameters learned with the embedding by the outer loop, through the solve (both systems
are symmetric positive definite and solved by Cholesky). There is no inner loop.

The reference code (bertinetto/r2d2) solves for a bias too and scales the system: a column of
ones appended to ``X`` (``solved_bias``: the query logits are ``scale * (X_q W + b) +
bias``), ``X`` and ``Y`` divided by ``sqrt(n)`` for ``n`` support examples
(``support_normalised``: the penalty ``n lambda`` on the unscaled system), and ``lambda`` fixed
at 50 (``learn_lambda=False``); its experiment configs set all three.

Needs a supervised classification task family and a model that declares an embedding, as
:mod:`~metalearn.algorithms.protonet` does; as there, the number of ways is not passed in:
targets have one column per label below the support-set size and labels absent from the
support set get logit ``-inf``. Padded episodes (:class:`~metalearn.data.task.WeightedBatch`)
work as they are: padding rows of ``X`` are zeroed and have no one-hot row, so the solve is
exactly that of the real support examples."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import ClassVar

import jax
import jax.numpy as jnp
from jax.scipy.linalg import cho_factor, cho_solve

from metalearn.algorithms.base import (
    MetaLearner,
    check_choice,
    check_positive,
    with_config,
)
from metalearn.algorithms.embedding import (
    check_classification,
    dense_head,
    embedding_model,
    features,
    query_classifier,
)
from metalearn.data.task import (
    Objective,
    Task,
    real_examples,
)
from metalearn.registry import ALGORITHMS

FORMS = ("auto", "primal", "dual")


@dataclasses.dataclass
class R2D2Config:
    # Read in training only (metalearn.evaluate refuses them as overrides).
    TRAINING_ONLY: ClassVar[Mapping[str, str]] = {
        "lambda_init": "it initialises the learned lambda (or fixes it, learn_lambda=false); "
        "the evaluation uses the trained run's",
        "scale_init": "it initialises the learned scale; the evaluation uses the checkpoint's",
        "bias_init": "it initialises the learned offset; the evaluation uses the checkpoint's",
    }

    name: str = "r2d2"
    lambda_init: float = 1.0  # the ridge penalty's start (learned as log lambda)
    learn_lambda: bool = True  # false: lambda stays lambda_init (the reference: 50)
    solved_bias: bool = False  # a column of ones in X: a per-class bias solved with W
    support_normalised: bool = False  # X and Y divided by sqrt(support examples) for the solve
    scale_init: float = 1.0  # the logits' learned scale alpha
    # The logits' learned offset beta (the paper's; one offset on every logit, so the softmax
    # cross-entropy does not depend on it and its gradient is 0).
    bias_init: float = 0.0
    # "auto": the dual (Woodbury) form when the support set has fewer examples than features,
    # else the primal; "primal" / "dual" force one (the same W, up to rounding).
    form: str = "auto"

    def __post_init__(self) -> None:  # a bad value is refused when the config is made
        check_positive("lambda_init", self.lambda_init)
        check_choice("form", self.form, FORMS)


def ridge_head(
    features: jax.Array, targets: jax.Array, lam: jax.Array, form: str = "auto"
) -> jax.Array:
    """``W [d, k]`` minimising ``|X W - Y|^2 + lambda |W|^2`` for ``X = features [n, d]``,
    ``Y = targets [n, k]``: ``(X^T X + lambda I)^-1 X^T Y`` (``"primal"``) or
    ``X^T (X X^T + lambda I)^-1 Y`` (``"dual"``); ``"auto"`` picks the smaller system.

    >>> import jax.numpy as jnp
    >>> ridge_head(jnp.array([[1.0], [2.0]]), jnp.array([[1.0], [2.0]]), 1.0).tolist()
    [[0.8333333134651184]]
    """
    n, d = features.shape
    if form == "auto":
        form = "dual" if n < d else "primal"
    if form == "primal":
        gram = features.T @ features + lam * jnp.eye(d, dtype=features.dtype)
        return cho_solve(cho_factor(gram), features.T @ targets)
    gram = features @ features.T + lam * jnp.eye(n, dtype=features.dtype)
    return features.T @ cho_solve(cho_factor(gram), targets)


CLASSES = "to regress one-hot targets of"  # what r2d2 does with a task's classes


@ALGORITHMS.register("r2d2", R2D2Config)
def r2d2(objective: Objective, config: R2D2Config | None = None, **overrides) -> MetaLearner:
    """R2D2 on the model's declared embedding: meta-parameters ``{"params": model parameters,
    "head": {"scale", "bias", "log_lambda"}}`` (scalars; no ``log_lambda`` when
    ``learn_lambda=False``).

    ``adapt`` returns the model parameters with the head replaced by the equivalent linear
    classifier (kernel ``scale * W``, bias ``scale * b + bias``, ``-inf`` for a class absent
    from the support set), so the model's ``apply`` on the adapted parameters predicts like the
    solved head; this needs a declared head of one Dense entry fed by the embedding.

    >>> import jax, jax.numpy as jnp
    >>> from metalearn.algorithms.base import context
    >>> from metalearn.data.task import Task, supervised_objective
    >>> from metalearn.models.base import ModelParts, model_from_flax
    >>> from metalearn.models.mlp import MLP
    >>> model = model_from_flax(MLP((32, 16), 3), (4,), ModelParts(head="head", embed="embed"))
    >>> learner = r2d2(supervised_objective(model, "classification"))
    >>> params, state = model.init(jax.random.key(1))
    >>> meta_params, ctx = learner.init(jax.random.key(0), params), context(state)
    >>> sorted(meta_params["head"])
    ['bias', 'log_lambda', 'scale']
    >>> x = jax.random.normal(jax.random.key(2), (12, 4))
    >>> labels = jnp.tile(jnp.arange(3), 4)
    >>> task = Task(support=(x[:6], labels[:6]), query=(x[6:], labels[6:]))
    >>> grads, aux = jax.jit(learner.task_grad)(meta_params, task, ctx)
    >>> sorted(aux.metrics), grads["head"]["log_lambda"].shape
    (['accuracy', 'loss'], ())
    """
    c = with_config(R2D2Config, config, overrides)
    model = embedding_model(objective, "r2d2")

    def init(key, model_params):
        del key
        f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
        head = {"scale": f32(c.scale_init), "bias": f32(c.bias_init)}
        if c.learn_lambda:
            head["log_lambda"] = f32(math.log(c.lambda_init))
        return {"params": model_params, "head": head}

    def embed(params, ctx, batch, stream, train):
        use = "to solve the ridge regression on"
        return features(model, params, ctx, batch, stream, train, "r2d2", use)

    def solve(meta_params, support, ctx, num_classes, train):
        """``(W [d, num_classes], b [num_classes], present [num_classes])`` on the support set
        (``b`` zero unless ``solved_bias``)."""
        check_classification(support, "r2d2", CLASSES)
        x, _ = embed(meta_params["params"], ctx, support, 0, train)
        d = x.shape[1]
        if c.solved_bias:
            x = jnp.concatenate([x, jnp.ones((x.shape[0], 1), x.dtype)], axis=1)
        real = real_examples(support)
        if real is not None:  # padding rows enter neither X^T X nor X X^T
            x = jnp.where(real[:, None], x, 0.0)
        targets = jax.nn.one_hot(support[1], num_classes, dtype=x.dtype)
        if c.support_normalised:
            count = x.shape[0] if real is None else real.sum()
            x, targets = x / jnp.sqrt(count), targets / jnp.sqrt(count)
        if c.learn_lambda:
            lam = jnp.exp(meta_params["head"]["log_lambda"]).astype(x.dtype)
        else:
            lam = jnp.asarray(c.lambda_init, x.dtype)
        w = ridge_head(x, targets, lam, c.form)
        b = w[d] if c.solved_bias else jnp.zeros(num_classes, x.dtype)
        return w[:d], b, targets.sum(0) > 0

    def logits_and_state(meta_params, task: Task, ctx, train=True):
        check_classification(task.query, "r2d2", CLASSES)
        num_classes = task.support[1].shape[0]  # static upper bound on the ways
        w, b, present = solve(meta_params, task.support, ctx, num_classes, train)
        query, state = embed(meta_params["params"], ctx, task.query, 1, train)
        head = meta_params["head"]
        logits = head["scale"] * (query @ w + b) + head["bias"]
        return jnp.where(present[None, :], logits, -jnp.inf), state, {}

    task_grad, evaluate = query_classifier(logits_and_state)

    def adapt_params(meta_params, support, ctx, inner_steps=0):
        del inner_steps  # no inner loop
        params = meta_params["params"]
        written = "r2d2's adapt writes the solved ridge head into the model's head"
        head, num_classes = dense_head(model, params, written)
        w, b, present = solve(meta_params, support, ctx, num_classes, False)
        scale, offset = meta_params["head"]["scale"], meta_params["head"]["bias"]
        bias = jnp.where(present, scale * b + offset, -jnp.inf)
        return {**params, head: {"kernel": scale * w, "bias": bias}}

    return MetaLearner(init, task_grad, evaluate, adapt_params)
