"""metalearn: gradient-based meta-learning on JAX.

Import the meta-gradient functions directly::

    from metalearn import adapt, maml_loss, hvp, hessian, per_example_grads, straight_through
"""

from metalearn.core import (
    CGResult,
    adapt,
    adapt_trajectory,
    cg_solve,
    hessian,
    hvp,
    inner_adam,
    lanczos_eigenvalues,
    maml_loss,
    per_example_grads,
    straight_through,
    top_hessian_eigenvalue,
)

__version__ = "0.1.0"

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
