"""One-line messages for a command line Hydra cannot compose, or a key no schema has.

Hydra reports a misspelt key, a value of the wrong type or an unknown group option in six to forty
lines, and its advice for a misspelt key ("To append to your config use +data.horizn=...") adds
the key to the config, where nothing reads it. ``metalearn.train`` prints
:func:`composition_error_message` instead, and :func:`unknown_keys` finds keys that were appended
with ``+`` so that they are refused too.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from hydra.errors import MissingConfigException, OverrideParseException
from omegaconf import DictConfig
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

from metalearn.registry import GROUPS
from metalearn.registry import PLUGINS_VARIABLE as PLUGINS

SCHEMA_SUFFIX = "_schema"  # ConfigStore entries that hold a group's schema, not an option


def selectable(group: str, option: str) -> bool:
    """Whether ``group=option`` is a choice for a command line: not a ``NAME_schema`` entry (a
    YAML's defaults, refused) nor a ``base_*`` experiment (the parts experiments share).

    >>> [selectable("algorithm", "maml_schema"), selectable("experiment", "base_rl")]
    [False, False]
    """
    if option.endswith(SCHEMA_SUFFIX):
        return False
    return not (group == "experiment" and option.startswith("base_"))


def name_key_group(key: str) -> str | None:
    """The config group whose ``name`` key ``key`` is (``algorithm.name``: ``algorithm``), or
    None: an option of the group sets it.

    >>> name_key_group("+algorithm.name"), name_key_group("algorithm.inner_lr")
    ('algorithm', None)
    """
    group, _, rest = key.lstrip("+~").partition(".")
    return group if group in GROUPS and rest == "name" else None


def group_name_override(key: str, value: str) -> str | None:
    """What is wrong with setting a config group's ``name`` key (``algorithm.name=reptile``):
    the group's option sets it, with its settings; None for any other key.

    >>> group_name_override("algorithm.name", "reptile")
    'algorithm.name=reptile: choose the algorithm with algorithm=reptile (its option sets its name and settings)'
    >>> group_name_override("name", "mine") is None
    True
    """  # noqa: E501
    group = name_key_group(key)
    if group:
        return (
            f"{key.lstrip('+~')}={value}: choose the {group} with {group}={value} (its option "
            "sets its name and settings)"
        )
    return None


def command_line_problem(argv: Sequence[str], experiments: Sequence[str]) -> str | None:
    """The first override of ``argv`` that selects what is no option: a ``base_*`` experiment
    (the parts experiments share; it ran as an experiment of its own, or failed to compose) or a
    group's ``name`` key (:func:`group_name_override`); None when there is none. ``experiments``
    are the selectable experiments, for the message.

    >>> command_line_problem(["+experiment=base_sinusoid"], ["sinusoid_maml"])
    'experiment=base_sinusoid holds what several experiments share and is not one to run; choose one of: sinusoid_maml'
    >>> command_line_problem(["+experiment=sinusoid_maml", "seed=1"], ["sinusoid_maml"]) is None
    True
    """  # noqa: E501
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep:
            continue
        if key.lstrip("+~") == "experiment":
            for name in value.split(","):
                if name.strip().startswith("base_"):
                    return (
                        f"experiment={name.strip()} holds what several experiments share and is "
                        f"not one to run; choose one of: {', '.join(experiments)}"
                    )
        problem = group_name_override(key, value)
        if problem:
            return problem
    return None


def quoted_override(key: str, value: str) -> str:
    """``key=value`` as one shell word that Hydra's override grammar parses back to ``value``.

    Hydra reads an unquoted ``=``, ``,`` or space in a value as syntax, and run directories are
    named after the overrides (``outputs/sinusoid_maml-algorithm=fomaml/...``, sweep jobs
    ``0_seed=0,trainer.meta_steps=20000``): such a value is quoted for Hydra, then for the shell.

    >>> quoted_override("hydra.run.dir", "/runs/sinusoid_maml/2026-11-25_10-00-00")
    'hydra.run.dir=/runs/sinusoid_maml/2026-11-25_10-00-00'
    >>> print(quoted_override("hydra.run.dir", "/runs/sinusoid_maml-algorithm=fomaml/10-00-00"))
    'hydra.run.dir="/runs/sinusoid_maml-algorithm=fomaml/10-00-00"'
    """
    if re.fullmatch(r"[A-Za-z0-9_./:+@%-]+", value):
        return f"{key}={value}"
    quote = "'" if '"' in value else '"'
    return shlex.quote(f"{key}={quote}{value}{quote}")


def unknown_key_message(full_key: str, schema: type) -> str:
    """Say that ``full_key`` is not a field of ``schema``, with the closest field and the list.

    >>> from metalearn.config import DistributedConfig
    >>> print(unknown_key_message("distributed.enable", DistributedConfig))  # doctest: +ELLIPSIS
    distributed.enable is not a setting of distributed (DistributedConfig: enabled, ...); did
    you mean distributed.enabled?
    """
    section, _, key = full_key.rpartition(".")
    names = [f.name for f in dataclasses.fields(schema)]
    close = difflib.get_close_matches(key, names, n=1)
    where = f"{section} ({schema.__name__}: " if section else "the config (top-level keys: "
    hint = f"; did you mean {section + '.' if section else ''}{close[0]}?" if close else ""
    return f"{full_key} is not a setting of {where}{', '.join(names)}){hint}"


def unknown_keys(
    node: DictConfig, schema: type, prefix: str = "", sections: Mapping[str, type] | None = None
) -> list[tuple[str, type]]:
    """Each dotted key of ``node`` that its schema has no field for, with that schema.

    Nested sections are checked against the dataclass their field defaults to, or against
    ``sections[key]`` (for fields typed ``Any``, such as the ``algorithm`` group's).

    >>> from omegaconf import OmegaConf
    >>> from metalearn.config import Config, EvalConfig
    >>> unknown_keys(OmegaConf.create({"seed": 0, "eval": {"num_task": 5}}), Config,
    ...              sections={"eval": EvalConfig})
    [('eval.num_task', <class 'metalearn.config.EvalConfig'>)]
    """
    fields = {f.name: f for f in dataclasses.fields(schema)}
    sections = sections or {}
    found = []
    for key in node:
        full = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            found.append((full, schema))
            continue
        factory = fields[key].default_factory
        nested = sections.get(key, factory if dataclasses.is_dataclass(factory) else None)
        child = node._get_node(key)
        if nested is not None and isinstance(child, DictConfig):
            found += unknown_keys(child, nested, full)
    return found


def composition_error_message(err: BaseException) -> str:
    """One line for an error Hydra or OmegaConf raised while composing the command line.

    >>> from hydra.errors import MissingConfigException
    >>> message = composition_error_message(MissingConfigException(
    ...     "Could not find 'algorithm/mamll'", "algorithm/mamll", ["maml", "maml_schema"]))
    >>> message.removesuffix(" (one of your own: name the module that registers it in "
    ...                      "METALEARN_PLUGINS)")
    'algorithm=mamll is not an option (did you mean maml?); use one of: maml'
    """
    cause = err.__cause__
    if isinstance(err, MissingConfigException) and err.missing_cfg_file and err.options:
        group, _, name = err.missing_cfg_file.rpartition("/")
        options = [o for o in err.options if selectable(group, o)]
        close = difflib.get_close_matches(name, options, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        message = (
            f"{group or 'config'}={name} is not an option{hint}; use one of: {', '.join(options)}"
        )
        if group in GROUPS:  # the groups a researcher's module adds to
            message += f" (one of your own: name the module that registers it in {PLUGINS})"
        return message
    if isinstance(err, OverrideParseException):
        message = f"cannot parse the override {err.override!r}: {_lines(err.message)}"
        key, _, value = err.override.partition("=")
        if "mismatched input '='" in err.message and not value.startswith(("'", '"')):
            message += f"; a value holding '=' needs quotes: {quoted_override(key, value)}"
        return message
    key_error = err if isinstance(err, _KEY_ERRORS) else cause
    if isinstance(key_error, _KEY_ERRORS) and _is_schema(key_error.object_type):
        return unknown_key_message(str(key_error.full_key), key_error.object_type)
    if isinstance(cause, ValidationError):  # "Error merging override optimizer.lr=fast"
        override = str(err).removeprefix("Error merging override ").strip()
        return f"{override}: {_lines(str(cause))}"
    return "; ".join(filter(None, [_lines(str(err)), _lines(str(cause)) if cause else ""]))


_KEY_ERRORS = (ConfigKeyError, ConfigAttributeError)  # OmegaConf raises either for a missing key


def _is_schema(object_type: Any) -> bool:
    return isinstance(object_type, type) and dataclasses.is_dataclass(object_type)


def _lines(text: str) -> str:
    """A multi-line message as one line, without OmegaConf's ``full_key:``/``object_type=``."""
    kept = []
    for line in text.splitlines():
        line = " ".join(line.split())
        if line and not line.startswith(("full_key:", "object_type=", "reference_type=")):
            kept.append(line)
    return "; ".join(kept)
