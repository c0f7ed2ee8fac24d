"""The config of a run: its schema (dataclasses that check their own values) and its
composition by Hydra.

>>> from metalearn.config import Config, to_objects
"""

from metalearn.config.compose import (
    SCHEMA_SUFFIX,
    check_group_choices,
    fill_added_keys,
    glob_free,
    register_configs,
    rename_old_keys,
    run_name,
    to_objects,
    unknown_key_message,
    unknown_keys,
    with_tuples,
)
from metalearn.config.schema import (
    GLOB_CHARACTERS,
    Config,
    DistributedConfig,
    EvalConfig,
    OptimizerConfig,
    TrainerConfig,
    training_only_reason,
)

__all__ = [
    "GLOB_CHARACTERS",
    "SCHEMA_SUFFIX",
    "Config",
    "DistributedConfig",
    "EvalConfig",
    "OptimizerConfig",
    "TrainerConfig",
    "check_group_choices",
    "fill_added_keys",
    "glob_free",
    "register_configs",
    "rename_old_keys",
    "run_name",
    "to_objects",
    "training_only_reason",
    "unknown_key_message",
    "unknown_keys",
    "with_tuples",
]
