"""Time MetaOptNet-SVM's head, forward and backward, with metalearn's solver and with qpax.

One episode: ``--ways`` x ``--shots`` support and 15 queries per class of post-ReLU Gaussian
features (``--dims``: 64 is Conv4's, 1600 ResNet-12's at 32x32 inputs, 640 after its global pool
at 84x84), the loss the query cross-entropy of ``scale * x_q . w_k``; timed is one jitted call of
its value and gradient with respect to the support and query features (median of ``--repeats``).

- ``metalearn``: :func:`metalearn.algorithms.metaoptnet.svm_dual` (accelerated projected
  gradients on the structured dual, implicit gradient by conjugate gradients).
- ``qpax``: ``qpax.solve_qp_primal`` (a primal-dual interior point method on the dense QP of
  ``n * ways`` variables, gradient through its relaxed KKT system), on the same dual: Hessian
  ``kron(K + I, I_ways)``, ``alpha <= C Y``, ``sum_k alpha_ik = 0``.

Each row also reports the KKT residual its solution reaches (``max |alpha - proj(alpha -
grad / L)| / C``, metalearn's stopping measure) and its distance to a float64 solution.

    python scripts/bench_svm_head.py --dims 64 1600 --shots 1 5 15
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from metalearn.algorithms.metaoptnet import _project_dual, svm_dual

C = 0.1


def episode(seed, ways, shots, dim, queries=15):
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(ways, dim))
    labels = np.repeat(np.arange(ways), shots)
    q_labels = np.repeat(np.arange(ways), queries)
    feats = lambda y: np.maximum(means[y] + rng.normal(size=(len(y), dim)), 0) / np.sqrt(dim) * 4  # noqa: E731
    return feats(labels), np.eye(ways)[labels], feats(q_labels), q_labels


def qpax_dual(gram, onehot, tol):
    import qpax

    n, k = onehot.shape
    hessian = jnp.kron(gram + jnp.eye(n, dtype=gram.dtype), jnp.eye(k, dtype=gram.dtype))
    equal = jnp.kron(jnp.eye(n, dtype=gram.dtype), jnp.ones((1, k), gram.dtype))
    x = qpax.solve_qp_primal(
        hessian,
        -onehot.ravel(),
        equal,
        jnp.zeros(n, gram.dtype),
        jnp.eye(n * k, dtype=gram.dtype),
        C * onehot.ravel(),
        solver_tol=tol,
    )
    return x.reshape(n, k)


def head_loss(impl, tol, iterations):
    def loss(support, query, onehot, q_labels):
        gram = support @ support.T
        if impl == "metalearn":
            alpha = svm_dual(gram, onehot, C, iterations, tol, 500)[0]
        else:
            alpha = qpax_dual(gram, onehot, tol)
        logits = query @ (alpha.T @ support).T
        return jnp.mean(jax.nn.logsumexp(logits, 1) - logits[jnp.arange(len(q_labels)), q_labels])

    return loss


def kkt_residual(gram, onehot, alpha):
    hessian = gram + np.eye(len(gram))
    lipschitz = np.linalg.eigvalsh(hessian)[-1]
    radius = C * onehot.sum(1)
    step = _project_dual(
        jnp.asarray(alpha - (hessian @ alpha - onehot) / lipschitz),
        jnp.asarray(C * onehot),
        jnp.asarray(radius),
        jnp.asarray(onehot.sum(0) > 0),
    )
    return float(np.max(np.abs(alpha - np.asarray(step))) / C)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 1600])
    parser.add_argument("--shots", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--ways", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--tolerance", type=float, default=1e-6)
    parser.add_argument("--iterations", type=int, default=5000)
    parser.add_argument("--impls", nargs="+", default=["metalearn", "qpax"])
    args = parser.parse_args()
    for dim in args.dims:
        for shots in args.shots:
            support, onehot, query, q_labels = episode(0, args.ways, shots, dim)
            gram64 = support @ support.T
            with jax.enable_x64(True):
                exact = np.asarray(
                    svm_dual(jnp.asarray(gram64), jnp.asarray(onehot), C, 100000, 1e-13, 10)[0]
                )
            inputs = [jnp.asarray(a, jnp.float32) for a in (support, query, onehot)]
            inputs.append(jnp.asarray(q_labels))
            for impl in args.impls:
                loss = head_loss(impl, args.tolerance, args.iterations)
                step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
                start = time.perf_counter()
                jax.block_until_ready(step(*inputs))
                compile_s = time.perf_counter() - start
                times = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    jax.block_until_ready(step(*inputs))
                    times.append(time.perf_counter() - start)
                gram32 = np.asarray(inputs[0] @ inputs[0].T, np.float64)
                if impl == "metalearn":
                    solve = jax.jit(
                        lambda g, y: svm_dual(g, y, C, args.iterations, args.tolerance, 500)
                    )
                    alpha = np.asarray(
                        solve(jnp.asarray(gram32, jnp.float32), inputs[2])[0], np.float64
                    )
                else:
                    solve = jax.jit(lambda g, y: qpax_dual(g, y, args.tolerance))
                    alpha = np.asarray(
                        solve(jnp.asarray(gram32, jnp.float32), inputs[2]), np.float64
                    )
                row = {
                    "impl": impl,
                    "device": str(jax.devices()[0]),
                    "dim": dim,
                    "ways": args.ways,
                    "shots": shots,
                    "queries": 15,
                    "tolerance": args.tolerance,
                    "ms_fwd_bwd": 1e3 * statistics.median(times),
                    "ms_min": 1e3 * min(times),
                    "compile_s": compile_s,
                    "kkt_residual": kkt_residual(gram64, onehot, alpha),
                    "max_abs_error_vs_f64": float(np.max(np.abs(alpha - exact))),
                }
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
