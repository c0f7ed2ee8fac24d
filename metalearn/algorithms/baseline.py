"""The fine-tuning baselines of Chen, Liu, Kira, Wang and Huang 2019 ("A Closer Look at
Few-shot Classification"): pretrain a classifier on every training class, then fit a new head
on each test task's support set with the embedding frozen.

- **Baseline** (``algorithm=baseline``): the model as it is, its head a linear layer over the
  training classes; a new linear head per test task.
- **Baseline++** (``algorithm=baseline_pp``): the head scores cosine similarities,
  ``scale * g_c * <x / |x|, v_c / |v_c|>``, with class-wise learned norms ``g`` (the
  reference's ``distLinear``: weight normalisation on the class vectors; ``scale`` 2 for at most
  200 classes, else 10); a new cosine head per test task.

Training is plain supervised learning: each meta-step's episodes carry their classes' indices in
the training split as labels (``data.train_labels=class``, which the model's head is sized by),
and the loss is the cross-entropy over the support and query examples together (class-balanced
batches, where the reference draws 16 images at random). The test-time head starts as PyTorch's
``nn.Linear`` does (uniform in ``+-1/sqrt(features)``, from the task's key) and takes
``eval.steps`` steps of PyTorch's SGD, as the reference does: mini-batches of 4 support examples
in a new random order each epoch (an epoch's last batch the remainder: 100 epochs are 200 steps
at 5 examples, 700 at 25), rate 0.01, momentum 0.9 with dampening 0.9, weight decay 0.001
(``finetune_batch_size=0``: full-batch steps). Labels are the episode's ``0..ways-1``; a class
absent from the support set gets logit ``-inf``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

import jax
import jax.numpy as jnp
import optax

from metalearn.algorithms.base import (
    MetaLearner,
    check_fraction,
    check_nonnegative,
    check_positive,
    hyperparameter,
    hyperparameter_values,
    hyperparameters,
    metrics_at_steps,
    with_config,
)
from metalearn.algorithms.embedding import (
    check_classification,
    dense_head,
    embedding_model,
    features,
)
from metalearn.data.task import (
    Aux,
    Objective,
    Task,
    WeightedBatch,
    apply_to_batch,
    real_examples,
    supervised_loss_and_metrics,
)
from metalearn.registry import ALGORITHMS


@dataclasses.dataclass
class BaselineConfig:
    """The test-time fine-tuning of the new head: its SGD rate (a :func:`hyperparameter`),
    momentum, dampening, weight decay and mini-batch size (the reference's). Its step counts
    are ``eval.steps``."""

    # Read in training only (metalearn.evaluate refuses them as overrides).
    TRAINING_ONLY: ClassVar[Mapping[str, str]] = {"scale": "the training head's logit scale"}

    name: str = "baseline"
    finetune_lr: float = hyperparameter(0.01)
    momentum: float = 0.9
    dampening: float = 0.9  # PyTorch's: the momentum buffer takes (1 - dampening) * gradient
    weight_decay: float = 0.001
    finetune_batch_size: int = 4  # support examples per step; 0: the whole support set
    # Baseline++ only: the cosine logits' scale; 0: the reference's, 2 for at most 200
    # classes, else 10 (chosen per head: the training head's and each test task's).
    scale: float = 0.0

    def __post_init__(self) -> None:  # a bad value is refused when the config is made
        check_positive("finetune_lr", self.finetune_lr)
        check_fraction("momentum", self.momentum)
        check_fraction("dampening", self.dampening)
        check_nonnegative("finetune_batch_size", self.finetune_batch_size)
        check_nonnegative("weight_decay", self.weight_decay)
        check_nonnegative("scale", self.scale)


@dataclasses.dataclass
class BaselinePPConfig(BaselineConfig):
    name: str = "baseline_pp"


def cosine_logits(x: jax.Array, head: Mapping[str, jax.Array], scale: float) -> jax.Array:
    """Baseline++'s logits, ``scale * g_c * <x / |x|, v_c / |v_c|>`` for ``head = {"v": [d,
    classes], "g": [classes]}`` (the reference adds 1e-5 to ``|x|``).

    >>> head = {"v": jnp.array([[3.0, 0.0], [4.0, 1.0]]), "g": jnp.array([1.0, 2.0])}
    >>> [round(v, 3) for v in cosine_logits(jnp.array([[6.0, 8.0]]), head, 2.0)[0].tolist()]
    [2.0, 3.2]
    """
    unit_x = x / (jnp.linalg.norm(x, axis=-1, keepdims=True) + 1e-5)
    unit_v = head["v"] / jnp.linalg.norm(head["v"], axis=0, keepdims=True)
    return scale * head["g"] * (unit_x @ unit_v)


def reference_scale(scale: float, num_classes: int) -> float:
    """The cosine head's scale: ``scale``, or for 0 the reference's (2 up to 200 classes, else
    10)."""
    return scale if scale else (2.0 if num_classes <= 200 else 10.0)


def linear_init(key: jax.Array, dim: int, num_classes: int, cosine: bool) -> dict:
    """A new head as PyTorch's ``nn.Linear(dim, num_classes)`` starts (uniform in
    ``+-1/sqrt(dim)``); for the cosine head its weight-normalised form (``v``, ``g = |v_c|``).
    Each class's column is drawn from its own key, so a head sized for padding starts with the
    same columns for the real classes.

    >>> small, large = (linear_init(jax.random.key(0), 4, k, False) for k in (2, 5))
    >>> bool((small["kernel"] == large["kernel"][:, :2]).all())
    True
    """
    k_w, k_b = jax.random.split(key)
    bound = 1.0 / jnp.sqrt(dim)
    columns = jnp.arange(num_classes)
    draw = lambda k, shape: jax.vmap(  # noqa: E731
        lambda c: jax.random.uniform(jax.random.fold_in(k, c), shape, minval=-bound, maxval=bound)
    )(columns)
    kernel = draw(k_w, (dim,)).T
    if cosine:
        return {"v": kernel, "g": jnp.linalg.norm(kernel, axis=0)}
    return {"kernel": kernel, "bias": draw(k_b, ())}


def pytorch_momentum(momentum: float, dampening: float) -> optax.GradientTransformation:
    """PyTorch SGD's momentum buffer: the first step's gradient, then ``momentum * buffer +
    (1 - dampening) * gradient`` (``optax.trace`` is the case ``dampening=0``).

    >>> tx = pytorch_momentum(0.9, 0.9)
    >>> g = jnp.ones(2)
    >>> first, state = tx.update(g, tx.init(g))
    >>> second, _ = tx.update(g, state)
    >>> first.tolist(), [round(v, 6) for v in second.tolist()]
    ([1.0, 1.0], [1.0, 1.0])
    """

    def init(params):
        return {"buffer": optax.tree.zeros_like(params), "started": jnp.zeros((), bool)}

    def update(updates, state, params=None):
        del params
        buffer = jax.tree_util.tree_map(
            lambda b, g: jnp.where(state["started"], momentum * b + (1 - dampening) * g, g),
            state["buffer"],
            updates,
        )
        return buffer, {"buffer": buffer, "started": jnp.ones((), bool)}

    return optax.GradientTransformation(init, update)


def finetune_batches(
    key: jax.Array, real: jax.Array, batch_size: int, num_steps: int
) -> tuple[jax.Array, jax.Array]:
    """The support examples of each fine-tuning step, as the reference draws them: epochs of
    mini-batches of ``batch_size`` over the real examples (``real``: their mask), in a new random
    order each epoch, the last batch of an epoch the remainder; padding never drawn. Returns
    indices ``[num_steps, batch_size]`` and the mask of those in use. An example's place in an
    epoch's order depends on its index only, so padding appended changes no batch.

    >>> indices, used = finetune_batches(jax.random.key(0), jnp.ones(5, bool), 4, 4)
    >>> used.sum(axis=1).tolist()  # epochs of 5 examples: a batch of 4, then the 1 left
    [4, 1, 4, 1]
    >>> sorted(indices[:2][used[:2]].tolist())  # each epoch takes every example once
    [0, 1, 2, 3, 4]
    """
    n = real.shape[0]
    count = real.sum()
    per_epoch = jnp.maximum((count + batch_size - 1) // batch_size, 1)

    def batch(step):
        epoch, position = step // per_epoch, step % per_epoch * batch_size
        draws = jax.random.fold_in(key, epoch)
        noise = jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(draws, i)))(jnp.arange(n))
        order = jnp.argsort(jnp.where(real, noise, 2.0))  # real examples first, shuffled
        order = jnp.concatenate([order, jnp.zeros(batch_size, order.dtype)])
        used = position + jnp.arange(batch_size) < count
        return jax.lax.dynamic_slice(order, (position,), (batch_size,)), used

    return jax.vmap(batch)(jnp.arange(num_steps))


def _merged(task: Task):
    """The support and query examples as one batch (a training step's classifier batch)."""
    s, q = task.support, task.query
    if isinstance(s, WeightedBatch):
        return WeightedBatch(*(jnp.concatenate([a, b]) for a, b in zip(s, q, strict=True)))
    return jnp.concatenate([s[0], q[0]]), jnp.concatenate([s[1], q[1]])


@ALGORITHMS.register("baseline", BaselineConfig, class_labels=True)
def baseline(objective: Objective, config: BaselineConfig | None = None, **overrides):
    """Baseline: the model pretrained as a classifier over the training classes; each test task
    gets a new linear head fitted on its support features.

    >>> import jax, jax.numpy as jnp
    >>> from metalearn.algorithms.base import context
    >>> from metalearn.data.task import Task, supervised_objective
    >>> from metalearn.models.base import ModelParts, model_from_flax
    >>> from metalearn.models.mlp import MLP
    >>> model = model_from_flax(MLP((32, 16), 10), (4,), ModelParts(head="head", embed="embed"))
    >>> learner = baseline(supervised_objective(model, "classification"), finetune_lr=0.1)
    >>> params, state = model.init(jax.random.key(1))
    >>> meta_params, ctx = learner.init(jax.random.key(0), params), context(state)
    >>> x = jax.random.normal(jax.random.key(2), (12, 4))
    >>> pretraining = Task(support=(x[:6], jnp.arange(6)), query=(x[6:], jnp.arange(6, 12)))
    >>> grads, aux = jax.jit(learner.task_grad)(meta_params, pretraining, ctx)
    >>> episode = Task(support=(x[:3], jnp.arange(3)), query=(x[:3], jnp.arange(3)))
    >>> evaluate = jax.jit(learner.evaluate, static_argnums=3)
    >>> evaluate(meta_params, episode, context(state, jax.random.key(3)), (0, 100))["accuracy"]
    Array([0., 1.], dtype=float32)
    """
    return fine_tuning_baseline(objective, with_config(BaselineConfig, config, overrides), False)


@ALGORITHMS.register("baseline_pp", BaselinePPConfig, class_labels=True)
def baseline_pp(objective: Objective, config: BaselinePPConfig | None = None, **overrides):
    """Baseline++: as :func:`baseline`, with cosine-similarity heads (:func:`cosine_logits`) in
    pretraining and at test time; meta-parameters ``{"params", "g"}``.

    >>> import jax, jax.numpy as jnp
    >>> from metalearn.algorithms.base import context
    >>> from metalearn.data.task import supervised_objective
    >>> from metalearn.models.base import ModelParts, model_from_flax
    >>> from metalearn.models.mlp import MLP
    >>> model = model_from_flax(MLP((32, 16), 10), (4,), ModelParts(head="head", embed="embed"))
    >>> learner = baseline_pp(supervised_objective(model, "classification"))
    >>> meta_params = learner.init(jax.random.key(0), model.init(jax.random.key(1))[0])
    >>> sorted(meta_params), meta_params["g"].shape
    (['g', 'params'], (10,))
    """
    config = with_config(BaselinePPConfig, config, overrides)
    return fine_tuning_baseline(objective, config, True)


def fine_tuning_baseline(objective: Objective, c: BaselineConfig, cosine: bool) -> MetaLearner:
    """Baseline (``cosine=False``) or Baseline++ on the model's declared embedding and head:
    meta-parameters ``{"params": model parameters}``, and for Baseline++ also ``"g"``, the
    class-wise norms of the cosine head whose class vectors are the model head's kernel columns.
    """
    name = c.name
    model = embedding_model(objective, name)
    own = hyperparameters(c)
    why = "to train a classifier over"
    # PyTorch's SGD, composed as the outer optimizer's (runner.experiment.build_optimizer): the
    # decay added to the gradient, then momentum; the rate applied in the step.
    sgd = optax.chain(
        optax.add_decayed_weights(c.weight_decay), pytorch_momentum(c.momentum, c.dampening)
    )

    def init(key, model_params):
        del key
        head, _ = dense_head(model, model_params, f"{name} trains the model's head")
        if not cosine:
            return {"params": model_params}
        kernel = model_params[head]["kernel"]
        return {"params": model_params, "g": jnp.linalg.norm(kernel, axis=0)}

    def task_grad(meta, task: Task, ctx):
        batch = _merged(task)
        check_classification(batch, name, why)

        def loss(m):
            params = m["params"]
            if cosine:
                head, num_classes = dense_head(model, params, f"{name} trains the model's head")
                x, state = features(model, params, ctx, batch, 0, True, name, why)
                v = {"v": params[head]["kernel"], "g": m["g"]}
                logits = cosine_logits(x, v, reference_scale(c.scale, num_classes))
            else:
                logits, state = apply_to_batch(model.apply, params, ctx.model_state, ctx.key, batch)
            value, metrics = supervised_loss_and_metrics("classification", logits, batch)
            return value, Aux(state, metrics)

        (_, aux), grads = jax.value_and_grad(loss, has_aux=True)(meta)
        return grads, aux

    def support_features(meta, support, ctx):
        x, _ = features(model, meta["params"], ctx, support, 0, False, name, "to fit a head on")
        return jax.lax.stop_gradient(x)

    def head_logits(head, x, num_classes):
        if cosine:
            return cosine_logits(x, head, reference_scale(c.scale, num_classes))
        return x @ head["kernel"] + head["bias"]

    def fitted_heads(meta, support, ctx, num_steps: int):
        """The new head after 0..num_steps fine-tuning steps (stacked), and the classes present
        in the support set."""
        check_classification(support, name, "to fit a head on")
        num_examples = num_classes = support[1].shape[0]  # static upper bound on the ways
        x = support_features(meta, support, ctx)
        key = jax.random.key(0) if ctx.key is None else jax.random.fold_in(ctx.key, 2)
        head = linear_init(key, x.shape[1], num_classes, cosine)
        rates = hyperparameter_values(ctx, own)
        real = real_examples(support)
        real = jnp.ones(num_examples, bool) if real is None else real
        present = jax.nn.one_hot(support[1], num_classes).sum(0) > 0  # padding's labels: -1
        batch_size = c.finetune_batch_size or num_examples
        indices, used = finetune_batches(jax.random.fold_in(key, 1), real, batch_size, num_steps)

        def batch_loss(h, batch):  # absent classes masked: the loss of a head over the task's ways
            index, weight = batch
            logits = jnp.where(present, head_logits(h, x[index], num_classes), -jnp.inf)
            logits = jnp.where(weight[:, None], logits, 0.0)  # unused slots: finite, weight 0
            labels = jnp.where(weight, support[1][index], 0)
            losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
            return jnp.sum(jnp.where(weight, losses, 0.0)) / jnp.maximum(weight.sum(), 1)

        def step(carry, batch):  # the step at the rate passed as data
            h, state = carry
            direction, state = sgd.update(jax.grad(batch_loss)(h, batch), state, h)
            h = jax.tree_util.tree_map(lambda p, d: p - rates.finetune_lr * d, h, direction)
            return (h, state), h

        _, later = jax.lax.scan(step, (head, sgd.init(head)), (indices, used))
        stacked = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a[None], b]), head, later)
        return stacked, present

    def evaluate(meta, task: Task, ctx, steps):
        heads, present = fitted_heads(meta, task.support, ctx, max(steps))
        check_classification(task.query, name, "to score")
        num_classes = present.shape[0]
        query, _ = features(model, meta["params"], ctx, task.query, 1, False, name, "to score")

        def metrics(head):
            logits = jnp.where(present, head_logits(head, query, num_classes), -jnp.inf)
            return supervised_loss_and_metrics("classification", logits, task.query)[1]

        return metrics_at_steps(heads, steps, metrics)

    def adapt(meta, support, ctx, inner_steps=100):
        """The model's parameters with the fitted linear head written into its head (padded
        with ``-inf`` logits for the training classes beyond the task's)."""
        params = meta["params"]
        if cosine:
            raise ValueError(
                f"algorithm={name}: its fitted head is a cosine classifier, which the model's "
                "Dense head cannot hold; use learner.evaluate for its predictions"
            )
        head_name, outputs = dense_head(model, params, f"{name}'s adapt writes the new head")
        heads, present = fitted_heads(meta, support, ctx, inner_steps)
        fitted = jax.tree_util.tree_map(lambda h: h[-1], heads)
        ways = present.shape[0]
        if ways > outputs:
            raise ValueError(
                f"algorithm={name}: a support set of {ways} examples needs a head of at least "
                f"{ways} outputs; the model's has {outputs}"
            )
        kernel = jnp.zeros((fitted["kernel"].shape[0], outputs)).at[:, :ways].set(fitted["kernel"])
        bias = (
            jnp.full((outputs,), -jnp.inf)
            .at[:ways]
            .set(jnp.where(present, fitted["bias"], -jnp.inf))
        )
        return {**params, head_name: {"kernel": kernel, "bias": bias}}

    return MetaLearner(init, task_grad, evaluate, adapt, hyper=own)
