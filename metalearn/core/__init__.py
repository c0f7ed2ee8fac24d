"""Pure meta-gradient math on pytrees. Imports jax and optax only."""

from metalearn.core.autodiff import per_example_grads, straight_through
from metalearn.core.curvature import (
    CGResult,
    cg_solve,
    hessian,
    hvp,
    lanczos_eigenvalues,
    top_hessian_eigenvalue,
)
from metalearn.core.inner_loop import adapt, adapt_trajectory, inner_adam, maml_loss

__all__ = [
    "CGResult",
    "adapt",
    "adapt_trajectory",
    "cg_solve",
    "hessian",
    "hvp",
    "inner_adam",
    "lanczos_eigenvalues",
    "maml_loss",
    "per_example_grads",
    "straight_through",
    "top_hessian_eigenvalue",
]
