"""Look inside a trained MAML-RL policy: the rollouts it samples before and after each inner step.

For measurements beyond eval.json's returns (a locomotion policy's speed, its control cost, its
exploration noise): :func:`load_trained_policy` loads a run directory's policy with the run's
own evaluation inner loop, :func:`probe_tasks` draws held-out tasks and keys that are the same
for every run (so two runs' measurements compare task by task), and :func:`adaptation_rollouts`
gives one task's batches after 0, 1, ..., ``num_steps`` inner steps. The probes in
``experiments/rl/*/probes/`` are written on these three.

>>> import jax
>>> from metalearn.rl.envs import ENVS
>>> env = ENVS["nav2d"]()
>>> tasks, keys = probe_tasks(env, 4)
>>> tasks.shape, keys.shape
((4, 2), (4,))
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from metalearn.rl.envs.base import Env
from metalearn.rl.inner import InnerConfig
from metalearn.rl.maml_rl import adaptation_batches
from metalearn.rl.rollout import Params, PolicyApply, Trajectories

# Fixed streams, apart from training's and the evaluation's: the probes' held-out tasks.
PROBE_TASKS_SEED = 20261124
PROBE_KEYS_SEED = 7


@dataclasses.dataclass(frozen=True)
class TrainedPolicy:
    """A run's policy and the inner loop its evaluation uses.

    ``which`` is what was loaded (``"best"``, ``"latest"`` or ``"init"``, the run's untrained
    initialisation) and ``step`` its meta-iteration (0 for ``init``).
    """

    run_dir: str
    which: str
    step: int
    params: Params
    env: Env
    policy_apply: PolicyApply
    inner: InnerConfig


def load_trained_policy(run_dir: str, which: str = "latest", num_steps: int = 3) -> TrainedPolicy:
    """Load a MAML-RL run's ``best``, ``latest`` or ``init`` policy, with ``num_steps`` inner
    steps as the run's evaluation takes them (the family's discount and baseline,
    ``algorithm.eval_lrs``, ``algorithm.eval_rollouts``).

    Call it before anything else computes with JAX: a locomotion run asks XLA:CPU for its
    serial LAPACK scheduling first, as ``metalearn.evaluate`` does. Raises FileNotFoundError or
    ValueError with a one-line message on a directory that is not a run, a run that is not
    MAML-RL, or a bad ``which`` or ``num_steps``.
    """
    from metalearn.rl.algorithm import evaluation_inner
    from metalearn.runner.saved_run import load_run

    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 0:
        raise ValueError(f"num_steps={num_steps!r}: give a count of inner steps, 0 or more")
    runner, saved = load_run(run_dir, which, check=_check_maml_rl)
    runner.close()
    objective = runner.exp.objective
    return TrainedPolicy(
        run_dir=run_dir,
        which=runner.loaded,
        step=runner.loaded_step,
        params=saved.meta_params,
        env=objective.env,
        policy_apply=objective.policy_apply,
        inner=evaluation_inner(runner.cfg.algorithm, objective.inner, num_steps),
    )


def _check_maml_rl(run_dir, cfg) -> None:
    from metalearn.rl.algorithm import MAMLRLAlgorithmConfig

    if not isinstance(cfg.algorithm, MAMLRLAlgorithmConfig):
        name = cfg.algorithm.name
        raise ValueError(f"{run_dir} is a {name} run; a probe needs algorithm=maml_rl")


def probe_tasks(env: Env, num_tasks: int) -> tuple[Any, jax.Array]:
    """``num_tasks`` held-out tasks and one key per task, the same for every run."""
    tasks = env.sample_tasks(jax.random.key(PROBE_TASKS_SEED), num_tasks)
    return tasks, jax.random.split(jax.random.key(PROBE_KEYS_SEED), num_tasks)


def adaptation_rollouts(
    policy: TrainedPolicy, key: jax.Array, task: Any
) -> tuple[list[Trajectories], Params]:
    """One task's batches after 0, 1, ..., ``policy.inner.num_steps`` inner steps (each
    ``policy.inner.num_rollouts`` episodes), and the adapted parameters: the batches whose mean
    returns the run's evaluation reports (:func:`metalearn.rl.maml_rl.adaptation_batches`).
    Jit-compatible.
    """
    return adaptation_batches(
        policy.env, policy.policy_apply, policy.params, key, task, policy.inner
    )
