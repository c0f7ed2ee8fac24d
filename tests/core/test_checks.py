"""The one check of step and iteration counts that core's functions share."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn import adapt, cg_solve, lanczos_eigenvalues
from metalearn.core.checks import check_count


@pytest.mark.parametrize("value", [1, 3, np.int64(2), np.int32(5)])
def test_a_count_is_returned_as_a_python_int(value):
    got = check_count("steps", value)
    assert got == int(value) and type(got) is int


@pytest.mark.parametrize("value", [0, -1, 0.0, 2.0, True, None, "3", np.float32(2)])
def test_anything_but_an_integer_at_least_one_is_refused(value):
    with pytest.raises(ValueError, match=r"^steps must be an integer >= 1, got "):
        check_count("steps", value)


def test_the_minimum_is_named_in_the_message():
    assert check_count("steps", 0, minimum=0) == 0
    with pytest.raises(ValueError, match=r"^steps must be an integer >= 0, got -1$"):
        check_count("steps", -1, minimum=0)


def test_the_three_step_counts_of_core_share_one_check():
    # adapt's num_steps, cg_solve's max_iters and lanczos_eigenvalues' num_iters had three
    # copies of this check; each says which setting it refuses, in the same words.
    w, batch = jnp.ones(2), (jnp.ones((3, 2)), jnp.ones(3))
    loss = lambda p, b: jnp.mean((b[0] @ p - b[1]) ** 2)  # noqa: E731
    with pytest.raises(ValueError, match=r"^num_steps must be an integer >= 1, got 0$"):
        adapt(loss, w, batch, inner_lr=0.1, num_steps=0)
    with pytest.raises(ValueError, match=r"^cg_solve: max_iters must be an integer >= 1, got 0$"):
        cg_solve(lambda v: v, jnp.ones(2), max_iters=0)
    with pytest.raises(ValueError, match=r"^num_iters must be an integer >= 1, got 0$"):
        lanczos_eigenvalues(lambda v: v, jnp.ones(2), 0)
    # A traced iteration limit (cg_solve under jit with max_iters an argument) is not checked.
    solve = jax.jit(lambda n: cg_solve(lambda v: 2 * v, jnp.ones(2), max_iters=n).x)
    np.testing.assert_allclose(solve(3), [0.5, 0.5])
