"""Implicit MAML (Rajeswaran, Finn, Kakade and Levine 2019): implicit meta-gradients.

The inner problem is proximal: ``phi = argmin_phi L_support(phi) + (lam / 2) |phi - theta|^2``,
solved approximately by ``inner_steps`` steps of gradient descent (the paper) or Adam from
``theta``; nothing is differentiated through those steps (``stop_gradient``). At an exact
solution ``d phi / d theta = (I + H / lam)^{-1}`` with ``H`` the Hessian of ``L_support`` at
``phi``, so the meta-gradient is ``x`` solving ``(I + H / lam) x = grad L_query(phi)``:
``cg_iters`` iterations of conjugate gradient with Hessian-vector products at ``phi``
(``curvature="hessian"``, the paper), or with the Gauss-Newton matrix in place of ``H``
(``curvature="gauss_newton"``: positive semi-definite, so CG cannot meet negative curvature).

The defaults are the robust variant (Adam inner loop, Gauss-Newton curvature): on sinusoid
regression with the paper's choices (gradient descent, exact Hessian) meta-training drives the
initialisation to where the support loss is sharply curved for some tasks; then a fixed-rate
inner descent diverges (NaN within ~1,000 meta-steps at meta-batch 25), and ``I + H / lam``
becomes indefinite. CG then stops before the direction of non-positive curvature (it returned
meta-gradients 100x the query gradient when it went on); the training metrics say how often:
``cg_nonpositive_curvature`` is the fraction of the meta-batch's tasks where it stopped so, and
``cg_residual`` the mean residual norm left.

Memory does not grow with ``inner_steps``: no inner-loop activations are kept for a backward pass.
The inner loop is a rolled ``lax.scan`` (``unroll=1``): nothing differentiates through it, and
compile time stays flat in ``inner_steps`` (unrolled, 200 steps of the sinusoid MLP take minutes
to compile on CPU).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

import jax
import jax.numpy as jnp
import optax

from metalearn.algorithms.base import (
    InnerLoopConfig,
    MetaLearner,
    check_choice,
    check_count,
    check_nonnegative,
    check_positive,
    evaluate_trajectory,
    hyperparameter_values,
    hyperparameters,
    inner_loss,
    query_loss,
    with_config,
)
from metalearn.core import adapt, adapt_trajectory, cg_solve, hvp
from metalearn.data.task import Objective, Task
from metalearn.registry import ALGORITHMS

INNER_OPTIMIZERS = ("sgd", "adam")
CURVATURES = ("hessian", "gauss_newton")


def gauss_newton_vp(predict, output_loss, params, batch, v):
    """``J^T H_out J v``: the generalised Gauss-Newton matrix of
    ``output_loss(predict(params, batch), batch)`` at ``params``.

    ``J`` is the Jacobian of ``predict(., batch)`` and ``H_out`` the Hessian of ``output_loss``
    with respect to the outputs (positive semi-definite for squared error and softmax
    cross-entropy), so the product is positive semi-definite too.

    >>> import jax.numpy as jnp
    >>> predict = lambda w, batch: jnp.tanh(batch[0] @ w)
    >>> output_loss = lambda out, batch: 0.5 * jnp.sum((out - batch[1]) ** 2)
    >>> x, w = jnp.array([[1.0, 2.0]]), jnp.array([0.0, 0.0])   # J = x at w = 0, H_out = 1
    >>> gauss_newton_vp(predict, output_loss, w, (x, jnp.ones(1)), jnp.array([1.0, 0.0]))
    Array([1., 2.], dtype=float32)
    """
    outputs, jv = jax.jvp(lambda p: predict(p, batch), (params,), (v,))
    h_jv = hvp(lambda out: output_loss(out, batch), outputs, jv)
    _, pullback = jax.vjp(lambda p: predict(p, batch), params)
    return pullback(h_jv)[0]


@dataclasses.dataclass
class IMAMLConfig(InnerLoopConfig):
    # Read in training only (metalearn.evaluate refuses them as overrides).
    TRAINING_ONLY: ClassVar[Mapping[str, str]] = {
        **InnerLoopConfig.TRAINING_ONLY,
        "cg_iters": "",
        "cg_tol": "",
        "curvature": "",
    }

    name: str = "imaml"
    inner_steps: int = 20
    lam: float = 20.0
    cg_iters: int = 5
    cg_tol: float = 1e-6
    inner_optimizer: str = "adam"
    curvature: str = "gauss_newton"

    def __post_init__(self) -> None:  # a bad value is refused when the config is made
        super().__post_init__()
        check_positive("lam", self.lam)
        check_count("cg_iters", self.cg_iters)
        check_nonnegative("cg_tol", self.cg_tol)
        check_choice("inner_optimizer", self.inner_optimizer, INNER_OPTIMIZERS)
        check_choice("curvature", self.curvature, CURVATURES)


def _squared_distance(a, b) -> jax.Array:
    squares = jax.tree_util.tree_map(lambda x, y: jnp.sum((x - y) ** 2), a, b)
    return sum(jax.tree_util.tree_leaves(squares))


@ALGORITHMS.register("imaml", IMAMLConfig)
def imaml(objective: Objective, config: IMAMLConfig | None = None, **overrides) -> MetaLearner:
    """iMAML: proximal inner loop (strength ``lam``), implicit meta-gradient by CG.

    ``inner_steps`` steps of ``inner_optimizer`` (``"sgd"``, or ``"adam"``: ``optax.adam``,
    whose bounded steps cannot diverge) at rate ``inner_lr`` on
    ``L_support(phi) + lam/2 |phi - theta|^2``;
    then ``cg_iters`` conjugate-gradient iterations (stopping early at relative residual
    ``cg_tol``) on ``(I + H / lam) x = grad L_query(phi)``. The meta-parameters are the model
    parameters. Evaluation fine-tunes with the same proximal objective. The defaults suit the
    sinusoid MLP, whose support-loss Hessian has eigenvalues up to ~200 at initialisation: a large
    ``lam`` keeps ``I + H / lam`` well conditioned for a 5-step CG. The paper's variant is
    ``inner_optimizer="sgd", curvature="hessian"`` (see the module docstring for why it is not
    the default). ``curvature="gauss_newton"`` needs an objective that declares its
    ``gauss_newton`` split (supervised objectives do).

    >>> import jax, jax.numpy as jnp
    >>> from metalearn.algorithms.base import context
    >>> from metalearn.data.sinusoid import sinusoid
    >>> from metalearn.data.task import family_objective
    >>> from metalearn.models.base import model_from_flax
    >>> from metalearn.models.mlp import MLP
    >>> tasks = sinusoid()
    >>> model = model_from_flax(MLP((40, 40), 1), (1,))
    >>> learner = imaml(family_objective(tasks, model), inner_steps=20, lam=20.0, cg_iters=5)
    >>> params, state = model.init(jax.random.key(1))
    >>> theta, ctx = learner.init(jax.random.key(0), params), context(state)
    >>> task = tasks.sample(tasks.splits["train"], jax.random.key(2), 10)
    >>> grads, aux = jax.jit(learner.task_grad)(theta, task, ctx)
    >>> evaluate = jax.jit(learner.evaluate, static_argnums=3)
    >>> grads["head"]["kernel"].shape, evaluate(theta, task, ctx, (0, 20))["mse"].shape
    ((40, 1), (2,))
    """
    c = with_config(IMAMLConfig, config, overrides)
    if c.curvature == "gauss_newton" and objective.gauss_newton is None:
        raise ValueError(
            "algorithm.curvature=gauss_newton needs a loss of the form output_loss(predict(...))"
            " (Objective.gauss_newton); this task family has none: use curvature=hessian"
        )
    own = hyperparameters(c)

    def solver(ctx):
        inner_lr = hyperparameter_values(ctx, own).inner_lr
        if c.inner_optimizer == "adam":
            return {"optimizer": optax.adam(inner_lr)}
        return {"inner_lr": inner_lr}

    def proximal_loss(theta, ctx, train=True):
        anchor = jax.lax.stop_gradient(theta)
        loss_fn = inner_loss(objective, ctx, train)
        return lambda phi, batch: loss_fn(phi, batch) + 0.5 * c.lam * _squared_distance(phi, anchor)

    def init(key, model_params):
        del key
        return model_params

    def adapt_params(theta, support, ctx, steps=c.inner_steps):
        theta = jax.lax.stop_gradient(theta)
        phi = adapt(
            proximal_loss(theta, ctx), theta, support, num_steps=steps, unroll=1, **solver(ctx)
        )
        return jax.lax.stop_gradient(phi)

    def task_grad(theta, task: Task, ctx):
        phi = adapt_params(theta, task.support, ctx)
        (_, aux), query_grad = jax.value_and_grad(
            lambda p: query_loss(objective, p, ctx, task.query), has_aux=True
        )(phi)
        support_loss = inner_loss(objective, ctx)

        def curvature_vp(v):
            if c.curvature == "gauss_newton":
                predict, output_loss = objective.gauss_newton
                key = None if ctx.key is None else jax.random.fold_in(ctx.key, 0)
                predict_p = lambda p, b: predict(p, ctx.model_state, key, b)  # noqa: E731
                return gauss_newton_vp(predict_p, output_loss, phi, task.support, v)
            return hvp(lambda p: support_loss(p, task.support), phi, v)

        def matvec(v):
            return jax.tree_util.tree_map(lambda vi, hvi: vi + hvi / c.lam, v, curvature_vp(v))

        solve = cg_solve(matvec, query_grad, max_iters=c.cg_iters, tol=c.cg_tol)
        # Averaged over the meta-batch: the residual left, and the fraction of tasks whose
        # I + H / lam was not positive definite along CG's path (its gradient is then the
        # iterate before that direction; a larger lam, or curvature=gauss_newton, avoids it).
        metrics = {
            **aux.metrics,
            "cg_residual": solve.residual_norm,
            "cg_nonpositive_curvature": solve.nonpositive_curvature.astype(jnp.float32),
        }
        return solve.x, aux._replace(metrics=metrics)

    def evaluate(theta, task: Task, ctx, steps):
        loss_fn = proximal_loss(theta, ctx, train=False)
        kwargs = solver(ctx)

        def trajectory(support, n):
            return adapt_trajectory(loss_fn, theta, support, num_steps=n, unroll=1, **kwargs)

        return evaluate_trajectory(objective, trajectory, task, ctx, steps)

    return MetaLearner(init, task_grad, evaluate, adapt_params, hyper=own)
