"""A task family that is not supervised plugs in from outside core/ and the runner.

A Gaussian bandit: a task is a vector of arm means (a shared prior plus task noise); the policy is
the model's logits (an MLP of a constant input); the task loss samples arm pulls from the policy
with the key it is given and returns the REINFORCE surrogate, with the policy's exact expected
reward as the metric that selects the best parameters. MAML meta-trains it through the library's
``meta_train_step`` and through the Hydra runner, with nothing added to core/ or runner/.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax

from metalearn.algorithms.base import context
from metalearn.algorithms.maml import maml
from metalearn.config import register_configs, to_objects
from metalearn.data.task import Aux, Objective, Task, TaskFamily, family_objective
from metalearn.models.base import ModelParts, model_from_flax
from metalearn.models.mlp import MLP
from metalearn.registry import TASKS
from metalearn.runner.loop import train_and_evaluate
from metalearn.runner.steps import init_train_state, make_meta_train_step, sample_tasks
from tests.conftest import compose_config


@dataclasses.dataclass
class GaussianBanditConfig:
    name: str = "gaussian_bandit"
    arms: int = 4
    task_noise: float = 0.5  # spread of a task's arm means around the prior
    reward_noise: float = 0.5  # spread of one pull's reward around its arm's mean
    pulls: int = 32  # arm pulls per loss evaluation


def bandit_objective(config: GaussianBanditConfig):
    def objective(model):
        def loss(params, model_state, key, means, train=True):
            logits, state = model.apply(params, model_state, None, jnp.ones((1, 1)), train)
            logits = logits[0]
            expected = jnp.sum(jax.nn.softmax(logits) * means)
            pull_key, reward_key = jax.random.split(key)
            arms = jax.random.categorical(pull_key, logits, shape=(config.pulls,))
            rewards = means[arms] + config.reward_noise * jax.random.normal(
                reward_key, (config.pulls,)
            )
            advantage = jax.lax.stop_gradient(rewards - expected)
            surrogate = -jnp.mean(jax.nn.log_softmax(logits)[arms] * advantage)
            return surrogate, Aux(state, {"reward": expected})

        return Objective(model, loss, primary_metric="reward", maximize=True)

    return objective


@TASKS.register("gaussian_bandit", GaussianBanditConfig)
def gaussian_bandit(config: GaussianBanditConfig | None = None) -> TaskFamily:
    c = config or GaussianBanditConfig()
    prior = jnp.linspace(1.0, -1.0, c.arms)  # arm 0 is best on average

    def sample(split_arrays, key, shots):
        del split_arrays, shots  # generated; the loss draws its own pulls
        means = prior + c.task_noise * jax.random.normal(key, (c.arms,))
        return Task(support=means, query=means)

    return TaskFamily(
        splits={"train": {}, "val": {}, "test": {}},
        sample=sample,
        input_shape=(1,),
        num_outputs=c.arms,
        objective=bandit_objective(c),
    )


def expected_reward(learner, objective, meta_params, tasks, inner_steps):
    keys = jax.random.split(jax.random.key(4), jax.tree_util.tree_leaves(tasks)[0].shape[0])
    per_task = jax.vmap(
        lambda t, k: learner.evaluate(meta_params, t, context(key=k), (inner_steps,))
    )(tasks, keys)
    return float(jnp.mean(per_task["reward"]))


def test_maml_meta_trains_a_bandit_policy_through_meta_train_step():
    family = gaussian_bandit()
    model = model_from_flax(MLP((8,), 4), family.input_shape, ModelParts(head="head"))
    objective = family_objective(family, model)
    learner = maml(objective, inner_lr=0.5, inner_steps=1)
    optimizer = optax.adam(0.02)
    state = init_train_state(learner, model, optimizer, jax.random.key(0))
    step = jax.jit(
        make_meta_train_step(
            learner, optimizer, meta_steps=150, strategy="vmap", key=jax.random.key(1)
        )
    )
    held_out = sample_tasks(family, {}, jax.random.key(2), 200, 1)
    before = expected_reward(learner, objective, state.meta_params, held_out, 1)
    for i in range(150):
        tasks = sample_tasks(family, {}, jax.random.fold_in(jax.random.key(3), i), 8, 1)
        state, metrics = step(state, tasks)
    after = expected_reward(learner, objective, state.meta_params, held_out, 1)
    assert int(state.step) == 150 and np.isfinite(float(metrics["reward"]))
    # A uniform policy earns the prior's mean, 0; the best arm on average earns ~1.
    assert abs(before) < 0.3
    assert after > before + 0.4, (before, after)


def test_the_runner_trains_and_selects_on_the_declared_metric(tmp_path):
    register_configs()  # store the schema of the family registered above
    cfg = to_objects(
        compose_config(
            [
                "data=gaussian_bandit",
                "model.hidden_sizes=[8]",
                "algorithm.inner_lr=0.5",
                "optimizer.lr=0.02",
                "+debug=tiny",
                "trainer.meta_steps=20",
                "trainer.eval_every=10",
                "trainer.log_every=10",
                "trainer.checkpoint_every=10",
                "eval.shots=[1]",
                "trainer.shots=1",
            ]
        )
    )
    summary = train_and_evaluate(cfg, str(tmp_path))
    assert summary["step"] == 20 and not summary["interrupted"]
    metrics = {r["metric"] for r in summary["eval"]}
    assert metrics == {"reward"}
    # The best validation score is the highest validation reward itself, not a negated loss.
    with open(tmp_path / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    rewards = [
        max((e for e in r["eval"] if e["metric"] == "reward"), key=lambda e: e["steps"])["mean"]
        for r in records
        if r.get("split") == "val"
    ]
    assert len(rewards) >= 2 and len(set(rewards)) > 1
    assert summary["best_val_score"] == max(rewards)
