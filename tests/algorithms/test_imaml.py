"""iMAML against the closed-form implicit gradient of a quadratic; memory flat in the steps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.algorithms.imaml import gauss_newton_vp, imaml
from metalearn.core import maml_loss
from metalearn.data.task import Aux, Task
from tests.algorithms.problems import (
    CTX,
    init_params,
    linear_model,
    linear_task,
    quadratic_terms,
    random_like,
    sine_model,
    sine_task,
)


@pytest.mark.parametrize("curvature", ["hessian", "gauss_newton"])  # the same for a linear model
def test_implicit_gradient_equals_the_exact_linear_solve(curvature):
    """Support loss 0.5 w^T A w - b^T w: the proximal solution is phi = (A + lam I)^-1 (b + lam
    theta), so d phi / d theta = lam (A + lam I)^-1 and the meta-gradient is
    (I + A / lam)^-1 grad L_query(phi), computed here with numpy in float64."""
    lam = 0.7
    with jax.enable_x64(True):
        theta, task = linear_task(seed=4, n=8, dim=3, dtype=np.float64)
        a, b = quadratic_terms(task.support)
        aq, bq = quadratic_terms(task.query)
        lr = 1.0 / (np.linalg.eigvalsh(a).max() + lam)  # descent converges geometrically
        learner = imaml(
            linear_model(3).objective,
            inner_lr=float(lr),
            inner_steps=400,
            lam=lam,
            cg_iters=3,
            cg_tol=0.0,
            inner_optimizer="sgd",
            curvature=curvature,
        )
        grad, _ = jax.jit(learner.task_grad)(theta, task, CTX)
        phi = jax.jit(learner.adapt)(theta, task.support, CTX)

    theta64 = np.asarray(theta)
    phi_exact = np.linalg.solve(a + lam * np.eye(3), b + lam * theta64)
    np.testing.assert_allclose(phi, phi_exact, rtol=1e-10, atol=1e-12)
    want = np.linalg.solve(np.eye(3) + a / lam, aq @ phi_exact - bq)
    np.testing.assert_allclose(grad, want, rtol=1e-9, atol=1e-12)
    # The same, by differentiating the closed form of phi(theta) with autodiff instead.
    with jax.enable_x64(True):

        def query_loss_of_exact_phi(t):
            phi_t = jnp.linalg.solve(a + lam * jnp.eye(3), b + lam * t)
            return 0.5 * phi_t @ aq @ phi_t - bq @ phi_t

        np.testing.assert_allclose(grad, jax.grad(query_loss_of_exact_phi)(theta), rtol=1e-9)


def test_gauss_newton_product_equals_the_explicit_jacobian_construction():
    """J^T H_out J v with J from jacfwd of a tanh layer and H_out of the mean squared error."""
    model = linear_model(4, jnp.tanh)
    w, task = linear_task(seed=7, n=6, dim=4)
    v = random_like(w, jax.random.key(4))
    predict = lambda p, batch: model.apply(p, batch[0])  # noqa: E731
    output_loss = lambda out, batch: model.loss(out, batch[1])  # noqa: E731
    got = jax.jit(gauss_newton_vp, static_argnums=(0, 1))(predict, output_loss, w, task.support, v)
    x, y = task.support
    jac = jax.jacfwd(lambda p: model.apply(p, x))(w)  # [examples, params]
    h_out = jax.hessian(lambda out: model.loss(out, y))(model.apply(w, x))  # I / n
    np.testing.assert_allclose(got, jac.T @ h_out @ jac @ v, rtol=1e-5, atol=1e-7)
    # Not the Hessian: the tanh curvature term is left out.
    full = jax.hessian(lambda p: model.loss_fn(p, task.support))(w) @ v
    assert not np.allclose(got, full, rtol=1e-3)


def test_adam_inner_loop_reaches_the_proximal_point_too():
    lam = 0.7
    with jax.enable_x64(True):
        theta, task = linear_task(seed=4, n=8, dim=3, dtype=np.float64)
        learner = imaml(linear_model(3).objective, inner_lr=0.01, inner_steps=2000, lam=lam)
        phi = jax.jit(learner.adapt)(theta, task.support, CTX)
    a, b = quadratic_terms(task.support)
    phi_exact = np.linalg.solve(a + lam * np.eye(3), b + lam * np.asarray(theta))
    np.testing.assert_allclose(phi, phi_exact, atol=1e-3)


def test_inner_loop_is_not_differentiated():
    theta, task = linear_task(seed=5)
    learner = imaml(linear_model(3).objective, inner_lr=0.1, inner_steps=3, lam=1.0)
    grad = jax.grad(lambda t: jnp.sum(learner.adapt(t, task.support, CTX)))(theta)
    np.testing.assert_array_equal(grad, np.zeros(3))


def temp_bytes(fn, *args) -> int:
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def memory_problem(kind):
    if kind == "tanh":  # a one-unit non-linear regressor, cheap to compile: the default suite
        model = linear_model(16, jnp.tanh)
        theta, task = linear_task(seed=6, n=200, dim=16)
        return model, theta, task
    model = sine_model()
    return model, init_params(model), sine_task(1, shots=50)


@pytest.mark.parametrize("kind", ["tanh", pytest.param("mlp", marks=pytest.mark.slow)])
def test_compiled_memory_does_not_grow_with_inner_steps(kind):
    """Temporary buffers of the compiled task_grad: flat from 5 to 50 inner steps for iMAML;
    backpropagating through the same number of (rolled) MAML steps grows with them."""
    model, params, task = memory_problem(kind)
    imaml_bytes = [
        temp_bytes(imaml(model.objective, inner_steps=n).task_grad, params, task, CTX)
        for n in (5, 50)
    ]
    assert imaml_bytes[1] <= 1.1 * imaml_bytes[0], imaml_bytes

    def maml_grad(n):  # backprop through a (rolled) inner loop stores every step
        return jax.grad(
            lambda p: maml_loss(
                model.loss_fn, p, task.support, task.query, inner_lr=0.01, num_steps=n, unroll=1
            )
        )

    maml_bytes = [temp_bytes(maml_grad(n), params) for n in (5, 50)]
    assert maml_bytes[1] > 4 * maml_bytes[0], (imaml_bytes, maml_bytes)


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"lam": 0.0}, "lam"),
        ({"lam": -1.0}, "lam"),
        ({"inner_lr": -0.01}, "inner_lr"),
        ({"inner_steps": 0}, "inner_steps"),
        ({"cg_iters": 0}, "cg_iters"),
        ({"cg_tol": -1e-3}, "cg_tol"),
        ({"inner_optimizer": "lbfgs"}, "inner_optimizer"),
        ({"curvature": "fisher"}, "curvature"),
    ],
)
def test_bad_config_values_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=f"algorithm.{key}"):
        imaml(linear_model(3).objective, **kwargs)


@pytest.mark.parametrize("lam, indefinite", [(0.5, True), (2.0, False)])
def test_an_indefinite_system_is_counted_in_the_training_metrics(lam, indefinite):
    """Support loss 0.5 w^T D w with D = diag(1, -1, 1) and query loss w_2: the system is
    (I + D / lam) x = e_2, whose e_2 entry 1 - 1 / lam is negative for lam < 1. CG's first
    direction is e_2, so it stops there (x = 0) for lam = 0.5, and solves x = e_2 / (1 - 1 / lam)
    for lam = 2."""

    def loss(params, model_state, key, batch, train=True):
        d, b = batch
        value = 0.5 * jnp.sum(d * params**2) - jnp.dot(b, params)
        return value, Aux(model_state, {"loss": value})

    objective = linear_model(3).objective._replace(loss=loss)
    support = (jnp.array([1.0, -1.0, 1.0]), jnp.zeros(3))
    query = (jnp.zeros(3), jnp.array([0.0, -1.0, 0.0]))
    learner = imaml(
        objective,
        inner_lr=0.1,
        inner_steps=3,
        lam=lam,
        cg_iters=5,
        cg_tol=0.0,
        inner_optimizer="sgd",
        curvature="hessian",
    )
    grad, aux = jax.jit(learner.task_grad)(jnp.array([0.3, 0.2, -0.1]), Task(support, query), CTX)
    assert float(aux.metrics["cg_nonpositive_curvature"]) == float(indefinite)
    if indefinite:
        np.testing.assert_array_equal(grad, np.zeros(3))
        assert float(aux.metrics["cg_residual"]) == pytest.approx(1.0)
    else:
        np.testing.assert_allclose(grad, [0.0, 1.0 / (1.0 - 1.0 / lam), 0.0], rtol=1e-6)
        assert float(aux.metrics["cg_residual"]) < 1e-6
