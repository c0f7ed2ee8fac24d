"""The config's schema: the dataclasses Hydra validates every composed config against, each
checking its own values when made (a one-line ValueError naming the key). The ``algorithm``,
``model`` and ``data`` groups are typed by the dataclasses registered in :mod:`metalearn.registry`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

from omegaconf import MISSING

from metalearn.core.batching import TASK_BATCHING, is_task_batching

OPTIMIZERS = ("adam", "adamw", "sgd")
SCHEDULES = ("constant", "cosine", "step")
MAX_SEED = 2**32 - 1  # JAX keys are built from 32 bits of the seed: larger seeds collide
MAX_INT32 = 2**31 - 1  # JAX computes with 32-bit integers: step counts, sizes, shapes
# Glob's special characters: orbax finds a checkpoint's pieces with glob on its save path.
GLOB_CHARACTERS = "[]*?"


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def settings(node: Any, kind: type, prefix: str = "") -> list[tuple[str, Any]]:
    """Every value of type ``kind`` in a config (in lists too, bools never), by dotted key.

    >>> settings(OptimizerConfig(lr=2.0), float, "optimizer")[0]
    ('optimizer.lr', 2.0)
    """
    if dataclasses.is_dataclass(node):
        found = []
        for field in dataclasses.fields(node):
            key = f"{prefix}.{field.name}" if prefix else field.name
            found += settings(getattr(node, field.name), kind, key)
        return found
    if isinstance(node, (list, tuple)):
        return [pair for item in node for pair in settings(item, kind, prefix)]
    return [(prefix, node)] if isinstance(node, kind) and not isinstance(node, bool) else []


def check_numbers(node: Any, prefix: str, seeds: tuple[str, ...] = ()) -> None:
    """Every float of ``node`` finite, every int but ``seeds`` within JAX's 32-bit integers."""
    for key, value in settings(node, float, prefix):
        require(math.isfinite(value), f"{key} must be a finite number, got {value}")
    for key, value in settings(node, int, prefix):  # overflowed in JAX (a traceback) or XLA
        require(
            key in seeds or abs(value) <= MAX_INT32,
            f"{key}={value} is beyond the 32-bit integers JAX computes with (at most "
            f"2**31 - 1 = {MAX_INT32}); give a smaller value",
        )


def check_seed(key: str, seed: int) -> None:
    require(
        0 <= seed <= MAX_SEED,
        f"{key} must be an integer in [0, 2**32 - 1] (JAX keys use 32 bits of it, so other "
        f"values collide with seeds in that range), got {seed}",
    )


def check_at_least(section: Any, prefix: str, minimum: int, *keys: str, hint: str = "") -> None:
    """``section.KEY >= minimum`` for each of ``keys``; the message names ``prefix.KEY``."""
    for key in keys:
        value = getattr(section, key)
        require(value >= minimum, f"{prefix}.{key} must be >= {minimum}{hint}, got {value}")


def check_used_by(section: Any, prefix: str, key: str, by: str) -> None:
    """A setting that only the option ``by`` reads is left at 0 under the chosen option."""
    value, chosen = getattr(section, key), section.name
    require(
        value == 0 or chosen == by,
        f"{prefix}.{key}={value} is used by {prefix}.name={by} only, and {prefix}.name={chosen}: "
        f"set {prefix}.name={by}, or leave {key} at 0",
    )


@dataclasses.dataclass
class OptimizerConfig:
    """The outer (meta) optimiser, built with optax."""

    name: str = "adam"  # adam | adamw | sgd
    lr: float = 1e-3
    # constant | cosine (decays to lr * final_lr_fraction) | step (lr * step_factors[i] from
    # meta-step step_boundaries[i] on)
    schedule: str = "constant"
    final_lr_fraction: float = 0.0
    step_boundaries: list[int] = dataclasses.field(default_factory=list)
    step_factors: list[float] = dataclasses.field(default_factory=list)
    warmup_steps: int = 0
    # adamw: decoupled from the gradient; sgd: added to it before the momentum (PyTorch's SGD)
    weight_decay: float = 0.0
    momentum: float = 0.0  # sgd only
    nesterov: bool = False  # sgd with momentum only
    grad_clip_norm: float = 0.0  # 0 disables clipping
    grad_clip_value: float = 0.0  # each gradient entry clipped to [-value, value]; 0: none

    def __post_init__(self) -> None:
        check_numbers(self, "optimizer")
        name = self.name
        require(name in OPTIMIZERS, f"optimizer.name must be one of {OPTIMIZERS}, got {name!r}")
        require(self.lr > 0, f"optimizer.lr must be > 0, got {self.lr}")
        require(
            self.schedule in SCHEDULES,
            f"optimizer.schedule must be one of {SCHEDULES}, got {self.schedule!r}",
        )
        check_at_least(
            self,
            "optimizer",
            0,
            "warmup_steps",
            "grad_clip_norm",
            "weight_decay",
            "grad_clip_value",
        )
        require(
            self.weight_decay == 0 or name in ("adamw", "sgd"),
            f"optimizer.weight_decay={self.weight_decay} is used by optimizer.name=adamw or sgd "
            f"only, and optimizer.name={name}: set one of those, or leave weight_decay at 0",
        )
        require(
            0 <= self.momentum < 1, f"optimizer.momentum must be in [0, 1), got {self.momentum}"
        )
        check_used_by(self, "optimizer", "momentum", "sgd")
        require(
            not self.nesterov or (name == "sgd" and self.momentum > 0),
            "optimizer.nesterov=true needs optimizer.name=sgd with optimizer.momentum > 0",
        )
        self._check_steps()
        require(
            0 <= self.final_lr_fraction <= 1,
            f"optimizer.final_lr_fraction must be in [0, 1], got {self.final_lr_fraction}",
        )

    def _check_steps(self) -> None:
        bounds, factors = list(self.step_boundaries), list(self.step_factors)
        if self.schedule != "step":
            require(
                not bounds and not factors,
                "optimizer.step_boundaries and step_factors are read by optimizer.schedule=step "
                f"only, and optimizer.schedule={self.schedule}: set it, or leave them empty",
            )
            return
        require(
            len(bounds) == len(factors) >= 1,
            f"optimizer.schedule=step needs as many step_factors as step_boundaries (at least "
            f"one), got {len(factors)} and {len(bounds)}",
        )
        require(
            all(a < b for a, b in zip([0, *bounds], bounds, strict=False)),
            f"optimizer.step_boundaries must be increasing meta-steps > 0, got {bounds}",
        )
        require(all(f > 0 for f in factors), f"optimizer.step_factors must be > 0, got {factors}")


@dataclasses.dataclass
class TrainerConfig:
    """The training loop."""

    # Settings an evaluation does not read (refused as its overrides), each with what sets its
    # part of an evaluation ("" when nothing does): see :func:`training_only_reason`.
    TRAINING_ONLY: ClassVar[Mapping[str, str]] = {
        "meta_steps": "",
        "meta_batch_size": "",
        "shots": "eval.shots are the evaluation's shots",
        "steps_per_call": "",
        "log_every": "",
        "eval_every": "",
        "checkpoint_every": "",
        "keep_checkpoints": "",
        "resume": "",
        "allow_changes": "",
        "progress_bar": "evaluate shows its progress on stderr by itself",
    }

    meta_steps: int = 70_000  # meta-updates in the whole run
    meta_batch_size: int = 25
    shots: int = 10  # support examples per class (per task for regression) during training
    # auto | vmap | unroll | map | map<k>: how tasks in a meta-batch run. auto on CPU: map for
    # RL task families and for conv models (a device per core), vmap otherwise.
    task_batching: str = "auto"
    steps_per_call: int = 0  # meta-steps fused into one jitted call (lax.scan); 0: auto
    log_every: int = 1000
    eval_every: int = 10_000  # 0: evaluate only at the end
    checkpoint_every: int = 10_000
    keep_checkpoints: int = 2
    resume: bool = True  # continue from the latest checkpoint in the run directory
    # Keys (or sections) a resumed run may change from the stored config, e.g. [trainer.meta_steps]
    allow_changes: list[str] = dataclasses.field(default_factory=list)
    shard_tasks: bool = True  # with several devices, split each meta-batch's tasks across them
    progress_bar: str = "auto"  # auto (a TTY gets a bar) | bar | lines
    # JAX's persistent compilation cache (runner/compilation_cache.py). auto: its environment
    # variable, else $XDG_CACHE_HOME/metalearn/jax; a path: that directory; off (or null): none.
    compilation_cache: str | None = "auto"

    def __post_init__(self) -> None:
        check_numbers(self, "trainer")
        check_at_least(self, "trainer", 0, "meta_steps", hint=" (0: evaluate the initialisation)")
        check_at_least(self, "trainer", 1, "meta_batch_size", "shots")
        check_at_least(self, "trainer", 0, "steps_per_call", hint=" (0: auto)")
        check_at_least(self, "trainer", 1, "log_every", "checkpoint_every")
        check_at_least(self, "trainer", 0, "eval_every")
        check_at_least(self, "trainer", 1, "keep_checkpoints")
        require(
            is_task_batching(self.task_batching),
            f"trainer.task_batching must be one of {TASK_BATCHING} or map<k> (k loops side by "
            f"side, e.g. map2), got {self.task_batching!r}",
        )
        require(
            self.progress_bar in ("auto", "bar", "lines"),
            f"trainer.progress_bar must be auto, bar or lines, got {self.progress_bar!r}",
        )


@dataclasses.dataclass
class EvalConfig:
    """Held-out evaluation: mean and 95% confidence interval over ``num_tasks`` tasks."""

    TRAINING_ONLY: ClassVar[Mapping[str, str]] = {
        "val_tasks": "eval.num_tasks is the number of test tasks",
        "select_best": "--which best|latest|init chooses the parameters evaluated",
    }

    shots: list[int] = dataclasses.field(default_factory=lambda: [5, 10, 20])
    steps: list[int] = dataclasses.field(default_factory=lambda: [0, 1, 5, 10])
    num_tasks: int = 600
    val_tasks: int = 200  # tasks of the validation split in each periodic evaluation
    tasks_per_call: int = 100  # tasks evaluated per jitted call
    seed: int = 1_000_003  # evaluation tasks come from this seed, never the training seed
    select_best: bool = True  # test the parameters that did best on the validation split

    def __post_init__(self) -> None:
        check_numbers(self, "eval", seeds=("eval.seed",))
        check_seed("eval.seed", self.seed)
        for key in ("shots", "steps"):
            values = list(getattr(self, key))
            require(len(values) >= 1, f"eval.{key} must be a non-empty list, got []")
            least = 1 if key == "shots" else 0
            require(min(values) >= least, f"eval.{key} must be >= {least}, got {values}")
            require(
                len(set(values)) == len(values),
                f"eval.{key} lists a value twice ({values}): give each once",
            )
        check_at_least(self, "eval", 1, "num_tasks", "val_tasks", "tasks_per_call")


@dataclasses.dataclass
class DistributedConfig:
    """Multi-host training through ``jax.distributed.initialize``."""

    enabled: bool = False
    coordinator_address: str | None = None  # host:port; unset: detected (e.g. from SLURM)
    num_processes: int | None = None
    process_id: int | None = None

    def __post_init__(self) -> None:
        check_numbers(self, "distributed")
        if self.coordinator_address is not None:  # "notaport": an IndexError traceback in JAX
            host, _, port = str(self.coordinator_address).rpartition(":")
            require(
                bool(host) and port.isdigit() and 0 < int(port) < 65536,
                f"distributed.coordinator_address={self.coordinator_address} is not HOST:PORT "
                "(the first process's host name or address and a free port, e.g. node01:12345)",
            )
        unused = [
            f"distributed.{k}={getattr(self, k)}"
            for k in ("coordinator_address", "num_processes", "process_id")
            if getattr(self, k) is not None
        ]
        require(
            self.enabled or not unused,
            f"{', '.join(unused)} {'are' if len(unused) > 1 else 'is'} used with "
            "distributed.enabled=true only: set it, or leave the distributed settings out (this "
            "process would have run alone, as process 0 of 1)",
        )


@dataclasses.dataclass
class Config:
    TRAINING_ONLY: ClassVar[Mapping[str, str]] = {
        "seed": "the test tasks are drawn from eval.seed",
        "name": "",
        "run_name": "",
        "optimizer": "",
        "distributed": "evaluate runs in one process",
    }

    algorithm: Any = MISSING
    model: Any = MISSING
    data: Any = MISSING
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    distributed: DistributedConfig = dataclasses.field(default_factory=DistributedConfig)
    seed: int = 0
    name: str = "run"
    run_name: str = ""  # name plus what the command line changed (conf/config.yaml); the run dir

    def __post_init__(self) -> None:  # the parts check their own ranges when made
        for group in ("algorithm", "model", "data"):
            part = getattr(self, group)
            if dataclasses.is_dataclass(part):
                check_numbers(part, group)
        check_seed("seed", self.seed)


def training_only_reason(cfg: Config, key: str) -> str | None:
    """Why an evaluation cannot depend on the setting ``key``, as the ``TRAINING_ONLY`` mapping
    of :class:`Config` or of the section's config class declares; None when it reads it.

    >>> training_only_reason(Config(), "seed")
    'seed is read in training only (the test tasks are drawn from eval.seed)'
    >>> training_only_reason(Config(), "trainer.meta_steps")
    'trainer.meta_steps is read in training only'
    >>> training_only_reason(Config(), "optimizer.lr")
    'optimizer.lr is read in training only'
    >>> training_only_reason(Config(), "eval.num_tasks") is None
    True
    """
    section, _, rest = key.lstrip("+").partition(".")
    if section in Config.TRAINING_ONLY:
        setting, hint = key.lstrip("+"), Config.TRAINING_ONLY[section]
    else:
        declared = getattr(type(getattr(cfg, section, None)), "TRAINING_ONLY", {})
        name = rest.partition(".")[0]
        if name not in declared:
            return None
        setting, hint = f"{section}.{name}", declared[name]
    return f"{setting} is read in training only" + (f" ({hint})" if hint else "")
