"""Task batching: every strategy gives the same meta-step; the CPU default for conv models."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from metalearn.algorithms.base import gradient_of
from metalearn.algorithms.maml import maml
from metalearn.core import batching as task_batching
from metalearn.data.episodes import episode_distribution
from metalearn.data.task import family_objective
from metalearn.models.base import model_from_flax
from metalearn.models.conv4 import CONV4_PARTS, Conv4Config, conv4
from metalearn.runner.steps import (
    TrainState,
    make_meta_step,
    make_meta_train_step,
)
from tests.cli import finished


def tiny_conv_experiment(conv: str):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (12, 4, 28, 28, 1), dtype=np.uint8)
    tasks = episode_distribution(
        {"train": images, "val": images, "test": images}, ways=3, num_queries=2, dataset="toy"
    )
    module = conv4(tasks.num_outputs, Conv4Config(filters=4, conv=conv))
    model = model_from_flax(module, tasks.input_shape, CONV4_PARTS)
    return tasks, model, maml(family_objective(tasks, model), inner_lr=0.4, inner_steps=2)


@pytest.mark.parametrize("conv", ["im2col", pytest.param("xla", marks=pytest.mark.slow)])
def test_every_task_batching_gives_the_same_meta_step(conv):
    tasks, model, learner = tiny_conv_experiment(conv)
    optimizer = optax.sgd(1.0)  # the update is the meta-gradient itself
    params = learner.init(jax.random.key(1), model.init(jax.random.key(0))[0])
    # (inner rate 0.4 on this toy: other initialisations make the meta-step chaotic, and
    # float-level differences between strategies grow to percents)
    state = TrainState(jnp.asarray(0, jnp.int32), params, {}, optimizer.init(params))
    results = {}
    for strategy in ("vmap", "map", "map2", "unroll"):
        train_step = make_meta_train_step(
            learner, optimizer, meta_steps=10, strategy=strategy, key=jax.random.key(3)
        )
        step = make_meta_step(
            train_step, tasks, train_key=jax.random.key(2), meta_batch_size=4, shots=1
        )
        results[strategy] = jax.jit(step)(state, tasks.splits["train"])
    for strategy in ("map", "map2", "unroll"):
        for got, want in zip(
            jax.tree_util.tree_leaves(results[strategy]),
            jax.tree_util.tree_leaves(results["vmap"]),
            strict=True,
        ):
            np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-6)
    moved = jax.tree_util.tree_map(lambda a, b: jnp.abs(a - b).max(), results["map"][0], state)
    assert float(max(jax.tree_util.tree_leaves(moved.meta_params))) > 0  # a real step


def tiny_experiment(algorithm: str):
    """A learner whose ``task_grad`` is a loss's gradient, its model and family: sinusoid for
    the inner-loop learners, toy episodes and a 4-filter Conv4 for the solved heads."""
    from metalearn import algorithms
    from metalearn.data.sinusoid import sinusoid
    from metalearn.models.base import ModelParts
    from metalearn.models.mlp import MLP

    if algorithm in ("protonet", "r2d2", "metaoptnet_svm"):
        images = np.random.default_rng(0).integers(0, 256, (12, 4, 28, 28, 1), dtype=np.uint8)
        family = episode_distribution(
            {"train": images, "val": images, "test": images}, ways=3, num_queries=2, dataset="toy"
        )
        module = conv4(family.num_outputs, Conv4Config(filters=4))
        model = model_from_flax(module, family.input_shape, CONV4_PARTS)
        overrides = {}
    else:
        family = sinusoid()
        model = model_from_flax(MLP((16, 16), 1), (1,), ModelParts(head="head"))
        overrides = {"inner_steps": 2} | ({} if algorithm == "meta_sgd" else {"inner_lr": 0.1})
        overrides |= {"film_module": "hidden_0"} if algorithm == "cavia" else {}
    learner = getattr(algorithms, algorithm)(family_objective(family, model), **overrides)
    return family, model, learner


LOSS_LEARNERS = ["maml", "meta_sgd", "anil", "boil", "cavia", "protonet", "r2d2", "metaoptnet_svm"]


@pytest.mark.parametrize("algorithm", LOSS_LEARNERS)
def test_the_gradient_of_the_mean_loss_is_the_mean_of_the_task_gradients(algorithm):
    """Under vmap a learner whose ``task_grad`` carries its loss (``gradient_of``) is
    differentiated once for the meta-batch; its update, model state and metrics equal those of
    averaging ``task_grad`` over the tasks."""
    from metalearn.runner.steps import init_train_state, sample_tasks

    family, model, learner = tiny_experiment(algorithm)
    assert callable(learner.task_grad.loss)  # made by gradient_of
    optimizer = optax.sgd(1.0)  # the update is the meta-gradient itself
    state = init_train_state(learner, model, optimizer, jax.random.key(0))
    tasks = sample_tasks(family, family.splits["train"], jax.random.key(1), 8, 2)
    # The same task_grad without the loss it carries: averaged over the tasks.
    without_its_loss = learner._replace(task_grad=lambda *args: learner.task_grad(*args))
    results, programs = [], []
    for one in (learner, without_its_loss):
        step = make_meta_train_step(
            one, optimizer, meta_steps=10, strategy="vmap", key=jax.random.key(2)
        )
        results.append(jax.jit(step)(state, tasks))
        programs.append(str(jax.make_jaxpr(step)(state, tasks)))
    assert programs[0] != programs[1]  # two ways of computing it, not one twice
    (once, once_metrics), (averaged, averaged_metrics) = results
    moves = [
        jax.tree_util.tree_map(jnp.subtract, new.meta_params, state.meta_params)
        for new in (once, averaged)
    ]
    largest = max(float(jnp.abs(x).max()) for x in jax.tree_util.tree_leaves(moves[1]))
    assert largest > 1e-3  # a real step
    # float32: the two sum the tasks' terms in different orders
    for got, want in zip(*map(jax.tree_util.tree_leaves, moves), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * largest)
    for key in averaged_metrics:
        # metaoptnet_svm's svm_residual (about 6e-7) is where its float32 solve stopped, below
        # its tolerance of 1e-6: a difference of order-one terms, compared on their scale
        atol = 1e-7 if key == "svm_residual" else 0.0
        np.testing.assert_allclose(once_metrics[key], averaged_metrics[key], rtol=1e-6, atol=atol)
    states = (once.model_state, averaged.model_state)  # Conv4's batch-norm statistics
    for got, want in zip(*map(jax.tree_util.tree_leaves, states), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert int(once.step) == int(averaged.step) == 1


def test_a_task_loss_that_is_not_a_scalar_and_aux_is_refused():
    from metalearn.data.sinusoid import sinusoid
    from metalearn.models.mlp import MLP
    from metalearn.runner.steps import init_train_state, sample_tasks

    family = sinusoid()
    model = model_from_flax(MLP((8,), 1), (1,))
    learner = maml(family_objective(family, model))

    def per_point_loss(params, task, ctx):  # one loss per query point, not a scalar
        return task.query[1] * 0, None

    refused = learner._replace(task_grad=gradient_of(per_point_loss))
    optimizer = optax.sgd(1.0)
    state = init_train_state(refused, model, optimizer, jax.random.key(0))
    step = make_meta_train_step(
        refused, optimizer, meta_steps=10, strategy="vmap", key=jax.random.key(2)
    )
    with pytest.raises(ValueError, match=r"task_loss must return \(scalar loss, Aux"):
        step(state, sample_tasks(family, {}, jax.random.key(1), 2, 5))


def test_mean_over_tasks_handles_pytrees_and_integer_metrics():
    tasks = {"x": jnp.arange(12.0).reshape(4, 3), "n": jnp.arange(4)}

    def fn(task):
        return {"sum": jnp.sum(task["x"]), "n": task["n"]}, task["x"] * 2

    for strategy, in_carry in [("vmap", True), ("map", True), ("map", False), ("unroll", True)]:
        (metrics, doubled) = task_batching.mean_over_tasks(fn, tasks, strategy, in_carry=in_carry)
        assert float(metrics["sum"]) == pytest.approx(16.5)
        assert float(metrics["n"]) == pytest.approx(1.5)
        np.testing.assert_allclose(doubled, jnp.arange(12.0).reshape(4, 3).mean(0) * 2)


def sharded_and_single_device_steps(batching: str = "map"):
    """(one-device, two-device) meta-steps and evaluations of the tiny Conv4 problem, second
    order; in a process started with two CPU devices. SGD at rate 1: the update is the
    meta-gradient."""
    from jax.sharding import Mesh

    from metalearn.runner.devices import TASK_AXIS, replicated
    from metalearn.runner.steps import make_eval_step, trained

    assert len(jax.devices()) == 2, jax.devices()
    tasks, model, learner = tiny_conv_experiment("im2col")
    optimizer = optax.sgd(1.0)
    params = learner.init(jax.random.key(1), model.init(jax.random.key(0))[0])
    state = TrainState(jnp.asarray(0, jnp.int32), params, {}, optimizer.init(params))
    keys = jax.random.split(jax.random.key(5), 4)
    results = []
    for mesh in (None, Mesh(jax.devices(), (TASK_AXIS,))):
        train_step = make_meta_train_step(
            learner, optimizer, meta_steps=10, strategy=batching, key=jax.random.key(3), mesh=mesh
        )
        step = make_meta_step(
            train_step, tasks, train_key=jax.random.key(2), meta_batch_size=4, shots=1, mesh=mesh
        )
        evaluate = make_eval_step(learner, tasks, steps=(0, 2), strategy=batching, mesh=mesh)
        arrays, start = replicated((tasks.splits["train"], state), mesh)
        new_state, metrics = jax.jit(step)(start, arrays)
        eval_args = (replicated(trained(state), mesh), arrays, replicated(keys, mesh), 1)
        scores = evaluate(*eval_args)
        results.append(jax.device_get((new_state, metrics, scores)))
    programs = {  # the two-device ones, compiled
        "meta-step": jax.jit(step).lower(start, arrays).compile().as_text(),
        "evaluation": evaluate.lower(*eval_args).compile().as_text(),
    }
    return jax.device_get(params), results, programs


def collectives(hlo: str) -> list[str]:
    """The cross-device operations of an optimised HLO module, by kind."""
    kinds = r"all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter"
    return re.findall(rf" ({kinds})(?:-start)?\(", hlo)  # the opcode, before its operands


def check_two_devices_match_one() -> None:
    """Run by the test below in a process with two CPU devices."""
    for batching in ("map", "vmap"):
        params, (one, two), programs = sharded_and_single_device_steps(batching)
        # Each device samples its own tasks and the host reads the evaluation's shards: the
        # meta-step's one exchange is the gradient mean (before, two gathers of the sampling's
        # random numbers as well, and four in the evaluation).
        assert collectives(programs["meta-step"]) == ["all-reduce"], programs["meta-step"][-2000:]
        assert collectives(programs["evaluation"]) == []
        leaves = jax.tree_util.tree_leaves
        for got, want in zip(leaves(two), leaves(one), strict=True):
            np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-6)
        moved = jax.tree_util.tree_map(lambda a, b: np.abs(a - b).max(), one[0].meta_params, params)
        assert max(float(m) for m in leaves(moved)) > 1e-3  # a real meta-gradient
    print("two devices match one")


def test_tasks_split_over_two_cpu_devices_give_the_map_meta_gradient():
    """The auto CPU path for conv models (each device loops over its half of the tasks and
    the means are averaged) gives the one-device ``map`` meta-gradient and evaluation."""
    import sys

    from tests.cli import REPO, checkout_env

    code = "from tests.runner.test_steps import check_two_devices_match_one as c; c()"
    result = finished(
        [sys.executable, "-c", code],
        600,
        cwd=REPO,
        env=checkout_env({**__import__("os").environ, "JAX_NUM_CPU_DEVICES": "2"}),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "two devices match one" in result.stdout
