"""Sinusoid regression (Finn et al. 2017, Section 5.1), generated on the device.

Each task is ``y = A sin(x - phase)`` with amplitude ``A ~ U[amp_min, amp_max]``, phase
``~ U[phase_min, phase_max]`` and inputs ``x ~ U[x_min, x_max]``.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from metalearn.data.task import Task, TaskFamily
from metalearn.registry import TASKS


@dataclasses.dataclass
class SinusoidConfig:
    name: str = "sinusoid"
    amplitude_range: tuple[float, float] = (0.1, 5.0)
    phase_range: tuple[float, float] = (0.0, math.pi)
    input_range: tuple[float, float] = (-5.0, 5.0)
    # query points per task; 0: as many as the support points (K), as the reference code draws
    # its tasks (cbfinn/maml: 2K points, the first K the support, in training and at test)
    num_queries: int = 10

    def __post_init__(self) -> None:  # a bad value is refused when the config is made
        for name in ("amplitude_range", "phase_range", "input_range"):
            _check_range(name, tuple(getattr(self, name)))
        if self.num_queries < 0:
            raise ValueError(
                "data.num_queries must be >= 1, or 0 for as many as the shots; got "
                f"{self.num_queries}"
            )


def sample_sinusoid_task(
    key: jax.Array,
    shots: int,
    num_queries: int,
    amplitude_range: tuple[float, float] = SinusoidConfig.amplitude_range,
    phase_range: tuple[float, float] = SinusoidConfig.phase_range,
    input_range: tuple[float, float] = SinusoidConfig.input_range,
) -> Task:
    """One sinusoid task with ``shots`` support and ``num_queries`` query points, shape (n, 1)."""
    k_amp, k_phase, k_x = jax.random.split(key, 3)
    amplitude = jax.random.uniform(k_amp, (), minval=amplitude_range[0], maxval=amplitude_range[1])
    phase = jax.random.uniform(k_phase, (), minval=phase_range[0], maxval=phase_range[1])
    x = jax.random.uniform(
        k_x, (shots + num_queries, 1), minval=input_range[0], maxval=input_range[1]
    )
    y = amplitude * jnp.sin(x - phase)
    return Task(support=(x[:shots], y[:shots]), query=(x[shots:], y[shots:]))


def _check_range(name: str, bounds: tuple[float, float]) -> None:
    if len(bounds) != 2 or not bounds[0] <= bounds[1]:
        raise ValueError(f"data.{name} must be [low, high] with low <= high, got {list(bounds)}")


@TASKS.register("sinusoid", SinusoidConfig)
def sinusoid(config: SinusoidConfig | None = None) -> TaskFamily:
    """The sinusoid task family (``config``: default :class:`SinusoidConfig`); every split draws
    from the same family.

    >>> import jax
    >>> tasks = sinusoid()
    >>> task = tasks.sample(tasks.splits["train"], jax.random.key(0), 5)
    >>> task.support[0].shape, task.query[1].shape
    ((5, 1), (10, 1))
    >>> as_many = sinusoid(SinusoidConfig(num_queries=0))
    >>> as_many.sample({}, jax.random.key(0), 5).query[1].shape
    (5, 1)
    """
    c = config or SinusoidConfig()
    ranges = dict(
        amplitude_range=tuple(c.amplitude_range),
        phase_range=tuple(c.phase_range),
        input_range=tuple(c.input_range),
    )
    num_queries = c.num_queries

    def sample(split_arrays, key, shots):
        del split_arrays  # generated, nothing stored
        return sample_sinusoid_task(key, shots, num_queries or shots, **ranges)

    return TaskFamily(
        splits={"train": {}, "val": {}, "test": {}},
        sample=sample,
        input_shape=(1,),
        num_outputs=1,
        kind="regression",
    )
