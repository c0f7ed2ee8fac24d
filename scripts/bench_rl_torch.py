"""The PyTorch peer of ``scripts/bench_rl.py``: MAML-RL on 2D navigation, one task at a time.

The same algorithm as :func:`metalearn.rl.maml_rl.make_meta_iteration` with its defaults,
written the way the PyTorch libraries write it (tristandeleu/pytorch-maml-rl, learn2learn with
cherry): a Python loop over the meta-batch's tasks, each sampling its rollouts from a NumPy
environment stepped for all of the task's rollouts at once with one policy call per time step,
the inner step with ``torch.autograd.grad(create_graph=True)``, and TRPO's Fisher-vector products
as double-backward through the KL gradient (computed once, its graph retained for the 10
conjugate-gradient iterations), then a backtracking line search that re-adapts every task for
every candidate.

Everything mirrors metalearn's code path, so that the two differ only in how they run:

- environment (``metalearn.rl.envs.nav2d``): start at the origin, move by
  ``clip(0.1 a, -0.1, 0.1)``, reward minus the distance to the goal, done when both coordinates
  are within 0.01 of the goal; horizon 100; steps after the one that ended an episode are masked;
- policy (``metalearn.rl.policy``): Gaussian MLP 2-100-100-2 (ReLU), learned log-std;
- baseline (``metalearn.rl.baseline``): rllab's linear features, ridge 1e-5, fitted per task in
  closed form; discount 0.99; the inner step's advantages normalised over the valid steps;
- inner step (``metalearn.rl.inner``): one VPG step of 0.1 on 20 rollouts;
- estimator: ProMP's LVC (``"lvc"``, the meta-iteration's default): the inner surrogate
  ``pi / stop(pi) * A`` differentiated through, the post-update surrogate the mean over rollouts
  of ``sum_t ratio_t A_t``;
- TRPO (``metalearn.rl.trpo``): CG (10 iterations, tolerance 1e-10, damping 1e-5) on the
  Hessian of the mean post-update KL, step ``sqrt(2 max_kl / d^T H d)``, backtracking 0.8 up to
  15 times until the KL is within 0.01 and the surrogate improves, else no step.

Tensors are float32 (``dtype`` can be float64 for checks); parameters are a list
``[w1, b1, w2, b2, w3, b3, log_std]`` with ``w`` shaped ``(in, out)`` as in metalearn.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

GOAL_LOW, GOAL_HIGH = -0.5, 0.5
ACTION_BOUND = 0.1
SUCCESS_RADIUS = 0.01
HORIZON = 100
REG_COEFF = 1e-5
LOG_2PI = math.log(2 * math.pi)


@dataclass(frozen=True)
class PeerConfig:
    """Finn et al.'s 2D navigation and metalearn's ``MAMLRLConfig()`` defaults."""

    num_tasks: int = 20
    num_rollouts: int = 20
    num_post_rollouts: int = 20
    inner_lr: float = 0.1
    discount: float = 0.99
    max_kl: float = 0.01
    cg_iters: int = 10
    cg_tol: float = 1e-10
    damping: float = 1e-5
    backtrack_ratio: float = 0.8
    max_backtracks: int = 15


class Nav2dEnv:
    """``num`` copies of the 2D point environment for one goal, stepped together (NumPy).

    >>> env = Nav2dEnv(np.array([0.3, 0.0]), num=1)
    >>> obs = env.reset()
    >>> obs, reward, done = env.step(np.array([[5.0, 0.5]]))     # x clipped to 0.1
    >>> obs.round(4).tolist(), reward.round(4).tolist(), done.tolist()
    ([[0.1, 0.05]], [-0.2062], [False])
    """

    def __init__(self, goal: np.ndarray, num: int, dtype: Any = np.float32):
        self.goal = np.asarray(goal, dtype)
        self.num, self.dtype = num, dtype
        self.position = np.zeros((num, 2), dtype)

    def reset(self) -> np.ndarray:
        self.position = np.zeros((self.num, 2), self.dtype)
        return self.position.copy()

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        move = np.clip(ACTION_BOUND * action.astype(self.dtype), -ACTION_BOUND, ACTION_BOUND)
        self.position = (self.position + move).astype(self.dtype)
        offset = self.position - self.goal
        reward = -np.sqrt(np.sum(offset**2, axis=-1))
        done = np.all(np.abs(offset) < SUCCESS_RADIUS, axis=-1)
        return self.position.copy(), reward, done


class Batch(NamedTuple):
    """Rollouts of one task: ``obs``/``actions`` ``(N, T, 2)``, ``rewards``/``mask`` ``(N, T)``."""

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    mask: torch.Tensor


def init_params(rng: np.random.Generator, dtype=torch.float32) -> list[torch.Tensor]:
    """Glorot-uniform weights, zero biases and log-std (as ``metalearn.rl.policy``)."""
    params = []
    for fan_in, fan_out in [(2, 100), (100, 100), (100, 2)]:
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        params.append(torch.tensor(rng.uniform(-limit, limit, (fan_in, fan_out)), dtype=dtype))
        params.append(torch.zeros(fan_out, dtype=dtype))
    params.append(torch.zeros(2, dtype=dtype))
    return [p.requires_grad_() for p in params]


def policy(params: list[torch.Tensor], obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and log-std of the Gaussian policy at ``obs`` (any leading axes)."""
    w1, b1, w2, b2, w3, b3, log_std = params
    h = torch.relu(obs @ w1 + b1)
    h = torch.relu(h @ w2 + b2)
    mean = h @ w3 + b3
    return mean, log_std.expand_as(mean)


def log_prob(params: list[torch.Tensor], batch: Batch) -> torch.Tensor:
    """Per-step log-density of the batch's actions, shaped like ``batch.rewards``."""
    mean, log_std = policy(params, batch.obs)
    z = (batch.actions - mean) * torch.exp(-log_std)
    return torch.sum(-0.5 * z**2 - log_std - 0.5 * LOG_2PI, dim=-1)


def sample_rollouts(
    params: list[torch.Tensor], goal: np.ndarray, num: int, rng: np.random.Generator
) -> Batch:
    """``num`` episodes of the horizon, all stepped together; stops once every one is done."""
    dtype = params[0].dtype
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    env = Nav2dEnv(goal, num, np_dtype)
    obs = env.reset()
    shape = (num, HORIZON)
    all_obs, all_actions = np.zeros(shape + (2,), np_dtype), np.zeros(shape + (2,), np_dtype)
    rewards, mask = np.zeros(shape, np_dtype), np.zeros(shape, np_dtype)
    ended = np.zeros(num, bool)
    with torch.no_grad():
        for t in range(HORIZON):
            mean, log_std = policy(params, torch.from_numpy(obs))
            noise = rng.standard_normal((num, 2)).astype(np_dtype)
            action = (mean + torch.exp(log_std) * torch.from_numpy(noise)).numpy()
            next_obs, reward, done = env.step(action)
            all_obs[:, t], all_actions[:, t], rewards[:, t] = obs, action, reward
            mask[:, t] = ~ended
            ended |= done
            obs = next_obs
            if ended.all():
                break
    return Batch(*(torch.from_numpy(a) for a in (all_obs, all_actions, rewards, mask)))


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, discount: float) -> torch.Tensor:
    """``R_t = sum_k discount^k r_{t+k}`` over the valid steps."""
    rewards = rewards * mask
    returns = torch.zeros_like(rewards)
    future = torch.zeros_like(rewards[:, 0])
    for t in range(rewards.shape[1] - 1, -1, -1):
        future = rewards[:, t] + discount * future
        returns[:, t] = future
    return returns * mask


def baseline_features(obs: torch.Tensor) -> torch.Tensor:
    """rllab's ``[o, o^2, t, t^2, t^3, 1]`` with ``o`` clipped to 10 and ``t = step / 100``."""
    o = obs.clamp(-10.0, 10.0)
    t = (torch.arange(obs.shape[1], dtype=obs.dtype) / 100.0)[None, :, None].expand(
        *obs.shape[:2], 1
    )
    return torch.cat([o, o**2, t, t**2, t**3, torch.ones_like(t)], dim=-1)


def advantages(batch: Batch, discount: float, normalize: bool) -> torch.Tensor:
    """Discounted returns minus the task's linear baseline (ridge solve), masked."""
    returns = discounted_returns(batch.rewards, batch.mask, discount)
    features = baseline_features(batch.obs).reshape(-1, 8)
    weights = batch.mask.reshape(-1)
    gram = features.T @ (weights[:, None] * features)
    rhs = features.T @ (weights * returns.reshape(-1))
    eye = torch.eye(gram.shape[0], dtype=gram.dtype)
    coeffs = torch.linalg.solve(gram + REG_COEFF * eye, rhs)
    adv = (returns - baseline_features(batch.obs) @ coeffs) * batch.mask
    if normalize:
        count = batch.mask.sum()
        mean = adv.sum() / count
        std = torch.sqrt((((adv - mean) * batch.mask) ** 2).sum() / count)
        adv = (adv - mean) / (std + 1e-8) * batch.mask
    return adv.detach()


def adapt(
    params: list[torch.Tensor], batch: Batch, adv: torch.Tensor, lr: float, create_graph: bool
) -> list[torch.Tensor]:
    """One VPG step on the LVC inner surrogate ``mean(pi / stop(pi) * A)`` over valid steps."""
    logp = log_prob(params, batch)
    surrogate = torch.sum(torch.exp(logp - logp.detach()) * adv * batch.mask) / batch.mask.sum()
    grads = torch.autograd.grad(surrogate, params, create_graph=create_graph)
    return [p + lr * g for p, g in zip(params, grads, strict=True)]


class TaskData(NamedTuple):
    """One task's samples: the pre-update batch and its normalised advantages, the post-update
    batch, its advantages, and the sampling policy's log-probabilities, means and log-stds."""

    pre: Batch
    pre_adv: torch.Tensor
    post: Batch
    post_adv: torch.Tensor
    post_logp: torch.Tensor
    post_mean: torch.Tensor
    post_log_std: torch.Tensor


def task_data(
    pre: Batch, pre_adv: torch.Tensor, adapted: list[torch.Tensor], post: Batch, cfg: PeerConfig
) -> TaskData:
    """A task's samples with the post-update advantages and sampling distribution."""
    with torch.no_grad():
        mean, log_std = policy(adapted, post.obs)
        post_logp = log_prob(adapted, post)
    post_adv = advantages(post, cfg.discount, normalize=False)
    return TaskData(pre, pre_adv, post, post_adv, post_logp, mean, log_std)


def inner_update(
    params: list[torch.Tensor], pre: Batch, cfg: PeerConfig
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The pre-update batch's normalised advantages and the (detached) adapted parameters."""
    pre_adv = advantages(pre, cfg.discount, normalize=True)
    return pre_adv, [p.detach() for p in adapt(params, pre, pre_adv, cfg.inner_lr, False)]


def collect_task(
    params: list[torch.Tensor], goal: np.ndarray, cfg: PeerConfig, rng: np.random.Generator
) -> TaskData:
    """Sample the inner batch, adapt, sample the post-update batch (one task)."""
    pre = sample_rollouts([p.detach() for p in params], goal, cfg.num_rollouts, rng)
    pre_adv, adapted = inner_update(params, pre, cfg)
    post = sample_rollouts(adapted, goal, cfg.num_post_rollouts, rng)
    return task_data(pre, pre_adv, adapted, post, cfg)


def task_surrogate_and_kl(
    params: list[torch.Tensor], data: TaskData, cfg: PeerConfig, create_graph: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The task's post-update surrogate and mean KL(sampling || adapted from ``params``)."""
    adapted = adapt(params, data.pre, data.pre_adv, cfg.inner_lr, create_graph)
    post = data.post
    ratio = torch.exp(log_prob(adapted, post) - data.post_logp)
    surrogate = torch.mean(torch.sum(ratio * data.post_adv * post.mask, dim=-1))
    mean, log_std = policy(adapted, post.obs)
    var_p, var_q = torch.exp(2 * data.post_log_std), torch.exp(2 * log_std)
    kl = log_std - data.post_log_std + (var_p + (data.post_mean - mean) ** 2) / (2 * var_q) - 0.5
    kl = torch.sum(kl.sum(-1) * post.mask) / post.mask.sum()
    return surrogate, kl


def meta_objectives(
    params: list[torch.Tensor], tasks: list[TaskData], cfg: PeerConfig, create_graph: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean over tasks (a Python loop) of the surrogate and the KL."""
    total_s, total_kl = 0.0, 0.0
    for data in tasks:
        s, kl = task_surrogate_and_kl(params, data, cfg, create_graph)
        total_s, total_kl = total_s + s, total_kl + kl
    return total_s / len(tasks), total_kl / len(tasks)


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _unflat(vector: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    out, start = [], 0
    for p in like:
        out.append(vector[start : start + p.numel()].view_as(p))
        start += p.numel()
    return out


def conjugate_gradient(matvec, b: torch.Tensor, iters: int, tol: float) -> torch.Tensor:
    """CG from zero, stopping after ``iters`` or once ``|r| <= tol |b|`` (as metalearn's)."""
    x, r = torch.zeros_like(b), b.clone()
    p, rr = r.clone(), r @ r
    threshold = tol**2 * (b @ b)
    for _ in range(iters):
        if not rr > threshold:
            break
        ap = matvec(p)
        alpha = rr / (p @ ap)
        x, r = x + alpha * p, r - alpha * ap
        rr_new = r @ r
        p, rr = r + (rr_new / rr) * p, rr_new
    return x


def natural_gradient_parts(params: list[torch.Tensor], tasks: list[TaskData], cfg: PeerConfig):
    """``(surrogate, flat meta-gradient, v -> (H_kl + damping I) v)``; the KL gradient's graph is
    built once and retained for every product (as pytorch-maml-rl does)."""
    surrogate, kl = meta_objectives(params, tasks, cfg, create_graph=True)
    grads = _flat(torch.autograd.grad(surrogate, params, retain_graph=True))
    kl_grads = _flat(torch.autograd.grad(kl, params, create_graph=True))

    def fvp(v: torch.Tensor) -> torch.Tensor:
        hv = torch.autograd.grad(kl_grads @ v, params, retain_graph=True)
        return _flat(hv) + cfg.damping * v

    return surrogate, grads, fvp


def trpo_step(
    params: list[torch.Tensor], tasks: list[TaskData], cfg: PeerConfig
) -> tuple[list[torch.Tensor], dict[str, float]]:
    """TRPO on the mean surrogate under the mean-KL bound; new leaf parameters and info."""
    surrogate, grads, fvp = natural_gradient_parts(params, tasks, cfg)
    direction = conjugate_gradient(fvp, grads, cfg.cg_iters, cfg.cg_tol)
    curvature = direction @ fvp(direction)
    scale = torch.sqrt(2.0 * cfg.max_kl / (curvature + 1e-8))
    before = float(surrogate.detach())
    flat_params = _flat([p.detach() for p in params])
    for k in range(cfg.max_backtracks + 1):
        step = flat_params + scale * cfg.backtrack_ratio**k * direction
        candidate = [p.requires_grad_() for p in _unflat(step.clone(), params)]
        value, divergence = meta_objectives(candidate, tasks, cfg, create_graph=False)
        if float(value) > before and float(divergence) <= cfg.max_kl:
            info = {"accepted": True, "backtracks": k, "kl": float(divergence)}
            return [p.detach().requires_grad_() for p in candidate], info
    return params, {"accepted": False, "backtracks": cfg.max_backtracks, "kl": 0.0}


def meta_iteration(
    params: list[torch.Tensor], rng: np.random.Generator, cfg: PeerConfig = PeerConfig()
) -> tuple[list[torch.Tensor], dict[str, float]]:
    """One meta-iteration: a meta-batch of goals, each task collected in turn, one TRPO step."""
    tic = time.perf_counter()
    goals = rng.uniform(GOAL_LOW, GOAL_HIGH, (cfg.num_tasks, 2))
    tasks = [collect_task(params, goal, cfg, rng) for goal in goals]
    collect_s = time.perf_counter() - tic
    params, info = trpo_step(params, tasks, cfg)
    info.update(collect_s=collect_s, trpo_s=time.perf_counter() - tic - collect_s)

    def returns(batch):
        return float((batch.rewards * batch.mask).sum(-1).mean())

    info["pre_return"] = statistics.mean(returns(t.pre) for t in tasks)
    info["post_return"] = statistics.mean(returns(t.post) for t in tasks)
    # steps the environments took: every rollout of a batch until all of them had ended
    info["env_steps"] = sum(
        int(b.mask.shape[0] * b.mask.any(0).sum()) for t in tasks for b in (t.pre, t.post)
    )
    return params, info


def run_peer(
    spec: dict[str, Any], init: list[np.ndarray], cfg: PeerConfig = PeerConfig()
) -> dict[str, Any]:
    """Time ``spec["warmup"]`` + ``spec["iters"]`` meta-iterations from the weights ``init``,
    with ``spec["torch_threads"]`` threads and the NumPy generator seeded ``spec["seed"]``."""
    torch.set_num_threads(spec["torch_threads"])
    params = [torch.tensor(a, dtype=torch.float32).requires_grad_() for a in init]
    rng = np.random.default_rng(spec["seed"])
    seconds, infos = [], []
    for _ in range(spec["warmup"] + spec["iters"]):
        tic = time.perf_counter()
        params, info = meta_iteration(params, rng, cfg)
        seconds.append(time.perf_counter() - tic)
        infos.append(info)
    timed = infos[spec["warmup"] :]
    return {
        "compile_s": 0.0,  # eager: nothing to compile
        "first_iter_s": seconds[0],
        "seconds": seconds[spec["warmup"] :],
        "env_steps_per_iter": statistics.median(i["env_steps"] for i in timed),
        "collect_s": statistics.median(i["collect_s"] for i in timed),
        "trpo_s": statistics.median(i["trpo_s"] for i in timed),
        "backtracks": [i["backtracks"] for i in timed],
        "post_return_last": timed[-1]["post_return"],
        "torch_threads": torch.get_num_threads(),
    }
