"""Name -> (config dataclass, factory) registries for the parts a config selects.

Each algorithm, model and task family registers itself with a config dataclass, the one home of
its defaults: Hydra validates a composed config group against that dataclass, and
:meth:`Registry.build` hands it to the factory (as ``config=``, or as keyword arguments to a
factory that takes its fields one by one). So one dataclass is both the schema and the
signature.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import inspect
import os
import sys
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from metalearn.errors import headline


@dataclasses.dataclass(frozen=True)
class Entry:
    config_cls: type
    factory: Callable[..., Any]
    info: dict = dataclasses.field(default_factory=dict)  # declarations, e.g. a model's parts
    # The spec of the factory's module when it registered: a reload gives the module a new one.
    module_spec: Any = None


class Registry:
    """A named set of (config dataclass, factory) entries, e.g. all algorithms."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, config_cls: type, **info: Any) -> Callable[[Callable], Callable]:
        """Decorator: ``@ALGORITHMS.register("maml", MAMLConfig)`` above the factory.

        ``info`` holds what the entry declares about itself beyond its config (a model's
        head, embedding and normalisation layers: :class:`metalearn.models.base.ModelParts`;
        an algorithm whose outer step does not use the ``optimizer`` section:
        ``outer_step_settings(config) -> str | None``, the settings it uses instead; a task
        family whose tasks are large: ``large_tasks=True``, and what its runs need of the
        machine: ``prepare_process(cfg)``, called before JAX's first computation, and
        ``run_refusal`` and ``run_warning``, each ``(cfg, task_batching, platform,
        device_count) -> str | None``, a line refusing the run or logged as it starts).

        A name is registered once: another factory under a known name (a researcher's module
        registering ``"maml"``, say, or registering one name twice) is refused, so it never
        replaces a part silently. Only a reload of the module that registered it (or a
        notebook cell run again) registers it anew. The config class must be a Hydra schema
        (:func:`check_schema`).
        """
        fields = {f.name for f in dataclasses.fields(config_cls)}
        if "name" not in fields:
            raise TypeError(f"{config_cls.__name__} needs a 'name' field")
        check_schema(config_cls, f"{self.kind} {name!r}")

        def decorate(factory: Callable) -> Callable:
            spec = getattr(sys.modules.get(factory.__module__), "__spec__", None)
            known = self._entries.get(name)
            if known is not None and _origin(known.factory) != _origin(factory):
                raise ValueError(
                    f"{self.kind} {name!r} is already registered by {_origin(known.factory)}; "
                    f"register {_origin(factory)} under another name"
                )
            if known is not None and spec is not None and known.module_spec is spec:
                raise ValueError(  # the same module, not reloaded: a copy registered twice
                    f"{self.kind} {name!r} is registered twice by {_origin(factory)} (lines "
                    f"{_first_line(known.factory)} and {_first_line(factory)} of "
                    f"{factory.__module__}); give one of them another name"
                )
            self._entries[name] = Entry(config_cls, factory, dict(info), spec)
            return factory

        return decorate

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entry(self, name: str) -> Entry:
        if name not in self._entries:
            raise ValueError(
                f"unknown {self.kind} {name!r}; known: {', '.join(self.names())} (one of your "
                f"own: name the module that registers it in {PLUGINS_VARIABLE})"
            )
        return self._entries[name]

    def build(self, config: Any, *args: Any) -> Any:
        """Call the factory registered under ``config.name`` with ``*args`` and the config.

        A factory with a ``config`` parameter gets the dataclass itself (its fields are the one
        home of the defaults); any other gets the fields as keyword arguments.
        """
        entry = self.entry(config.name)
        signature = inspect.signature(entry.factory)
        if "config" in signature.parameters:
            kwargs = {"config": config}
        else:
            kwargs = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
            kwargs.pop("name")
        try:  # a factory of a researcher's own that the runner cannot call was a traceback
            signature.bind(*args, **kwargs)
        except TypeError as err:
            shown = ", ".join([*(f"<{type(a).__name__}>" for a in args), "config=..."])
            raise ValueError(
                f"{self.kind} {config.name!r}: its factory {_origin(entry.factory)}{signature} "
                f"cannot be called as {entry.factory.__name__}({shown}) ({err}); give it "
                "those parameters, as in docs/extending.md"
            ) from None
        return entry.factory(*args, **kwargs)

    def outside_origin(self, name: str) -> str | None:
        """``module.factory`` of ``name`` when it was registered from outside metalearn."""
        entry = self._entries.get(name)
        if entry is None or entry.factory.__module__.startswith("metalearn."):
            return None
        return _origin(entry.factory)

    def outside_files(self) -> set[str]:
        """The source files of the entries registered from outside metalearn (a researcher's
        own modules): their factories' and config classes'."""
        parts = [p for e in self._entries.values() for p in (e.factory, e.config_cls)]
        return {path for path in map(_outside_source_file, parts) if path}


def _outside_source_file(part: Callable | type) -> str | None:
    """The absolute source file of a factory or class defined outside metalearn, or None."""
    if part.__module__.startswith("metalearn."):
        return None
    with contextlib.suppress(TypeError, OSError):
        path = inspect.getsourcefile(part)
        return os.path.abspath(path) if path else None
    return None


def _origin(factory: Callable) -> str:
    return f"{factory.__module__}.{factory.__qualname__}"


def _first_line(factory: Callable) -> int | str:
    code = getattr(factory, "__code__", None)
    return code.co_firstlineno if code is not None else "?"


def check_schema(config_cls: type, part: str) -> None:
    """TypeError (one line) unless ``config_cls`` can be a Hydra schema: each field of a type
    OmegaConf holds (``str``, ``int``, ``float``, ``bool``, an enum, a dataclass, lists, tuples
    and dicts of them, or ``Any``). A field typed ``Callable`` or a class of one's own was a
    traceback when the configs were registered, ending every command of the installation.

    >>> @dataclasses.dataclass
    ... class Bad:
    ...     name: str = "bad"
    ...     schedule: Callable | None = None
    >>> check_schema(Bad, "algorithm 'bad'")
    Traceback (most recent call last):
    ...
    TypeError: algorithm 'bad': its config class Bad cannot be a Hydra schema: field 'schedule': ...
    """
    from omegaconf import OmegaConf  # noqa: PLC0415 (the registries import without it)

    try:
        OmegaConf.structured(config_cls)
    except Exception as err:  # OmegaConf's errors, or a NameError of an annotation
        field = getattr(err, "full_key", None)
        where = f"field {field!r}: " if field else ""
        raise TypeError(
            f"{part}: its config class {config_cls.__name__} cannot be a Hydra schema: {where}"
            f"{headline(err).split(': ', 1)[-1]}; type its fields str, int, float, bool, "
            "lists, tuples, dicts or dataclasses, and build anything else in the factory"
        ) from None


def with_config(config_cls: type, config: Any, overrides: dict) -> Any:
    """``config`` (default: ``config_cls()``) with ``overrides`` replaced: a factory's settings.

    >>> @dataclasses.dataclass
    ... class Demo:
    ...     name: str = "demo"
    ...     steps: int = 1
    >>> with_config(Demo, None, {"steps": 3}).steps, with_config(Demo, Demo(steps=2), {}).steps
    (3, 2)
    """
    config = config_cls() if config is None else config
    return dataclasses.replace(config, **overrides) if overrides else config


ALGORITHMS = Registry("algorithm")
MODELS = Registry("model")
TASKS = Registry("task family")
GROUPS: dict[str, Registry] = {"algorithm": ALGORITHMS, "model": MODELS, "data": TASKS}
# Parts a run selects by a setting other than a group's name, registered outside the registries
# above: an RL environment (``metalearn.rl.envs.base.register_env``, selected by ``data.env``).
# setting -> name -> factory; a factory's module outside metalearn is a researcher's code too.
OTHER_PARTS: dict[str, dict[str, Callable]] = {}


def register_other_part(setting: str, name: str, factory: Callable) -> None:
    """Record ``factory`` as the part ``setting=name`` selects (``"data.env"``, ``"nav2d"``).

    As in :meth:`Registry.register`, another factory under a known name is refused, so a
    researcher's module never replaces a part silently; a reload registers it anew.
    """
    known = OTHER_PARTS.setdefault(setting, {}).get(name)
    if known is not None and _origin(known) != _origin(factory):
        raise ValueError(
            f"{setting}={name} is already registered by {_origin(known)}; register "
            f"{_origin(factory)} under another name"
        )
    OTHER_PARTS[setting][name] = factory


def selected_parts(cfg: Any) -> dict[str, str]:
    """The parts a config selects, ``{"algorithm": name, "model": name, "data": name}`` and
    each setting of :data:`OTHER_PARTS` it holds (``"data.env": name``); ``cfg`` is a composed
    config or its dataclasses.

    >>> selected_parts({"algorithm": {"name": "maml"}, "data": {"name": "rl_env", "env": "nav2d"}})
    {'algorithm': 'maml', 'data': 'rl_env', 'data.env': 'nav2d'}
    """
    parts = {}
    for key in (*GROUPS, *OTHER_PARTS):
        value = cfg
        for attribute in [key, "name"] if key in GROUPS else key.split("."):
            if isinstance(value, Mapping):
                value = value.get(attribute)
            else:
                value = getattr(value, attribute, None)
            if value is None:
                break
        if isinstance(value, str):
            parts[key] = value
    return parts


def _outside_origin(setting: str, name: str) -> str | None:
    """``module.factory`` of the part ``setting=name`` if registered from outside metalearn."""
    if setting in GROUPS:
        return GROUPS[setting].outside_origin(name)
    factory = OTHER_PARTS.get(setting, {}).get(name)
    if factory is None or factory.__module__.startswith("metalearn."):
        return None
    return _origin(factory)


# A researcher's own parts live in modules of their own, which register themselves on import.
PLUGINS_VARIABLE = "METALEARN_PLUGINS"  # comma-separated module names, e.g. "my_algos,lab.data"
PLUGINS_ENTRY_POINTS = "metalearn.plugins"  # an installed package's entry-point group


class PluginError(ValueError):
    """A module named in ``METALEARN_PLUGINS`` (or a ``metalearn.plugins`` entry point) could
    not be imported; the message is one line."""


def load_plugins() -> list[str]:
    """Import the modules that register a researcher's own algorithms, models and task families.

    They are named in the environment variable ``METALEARN_PLUGINS`` (comma-separated module
    names, found on the import path: the current directory under ``python -m``, or
    ``PYTHONPATH``) and by installed packages under the entry-point group
    ``metalearn.plugins``. ``metalearn.train`` and ``metalearn.evaluate`` call this before they
    read a config, so ``algorithm=NAME`` selects a registered ``NAME`` on the command line, in
    sweeps and in SLURM jobs (which inherit the variable). Returns the modules imported; raises
    :class:`PluginError` with one line naming the module, the error and where it was raised.

    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {PLUGINS_VARIABLE: "json, string"}):
    ...     load_plugins()
    ['json', 'string']
    """
    imported = []
    for entry_point in importlib.metadata.entry_points(group=PLUGINS_ENTRY_POINTS):
        where = f"the {PLUGINS_ENTRY_POINTS} entry point {entry_point.name} = {entry_point.value}"
        _import_plugin(entry_point.value, where, entry_point.load)
        imported.append(entry_point.value)
    names = [n.strip() for n in os.environ.get(PLUGINS_VARIABLE, "").split(",") if n.strip()]
    for name in names:
        where = f"{PLUGINS_VARIABLE}={os.environ[PLUGINS_VARIABLE]}"
        if name.endswith(".py") or "/" in name or name.startswith("."):
            raise PluginError(
                f"{where}: {name!r} is not a module name; name the module as Python imports it "
                f"(my_algos for my_algos.py, mylab.algos for mylab/algos.py) and put the "
                "directory that holds it on PYTHONPATH"
            )
        _import_plugin(name, where, lambda name=name: importlib.import_module(name))
        imported.append(name)
    return imported


def _import_plugin(name: str, where: str, load: Callable[[], Any]) -> None:
    try:
        load()
    except ModuleNotFoundError as err:
        if err.name == name or name.startswith(f"{err.name}."):  # the module, not one it imports
            raise PluginError(
                f"{where}: no module named {name!r} on the import path; run from its directory "
                "or add that directory to PYTHONPATH"
            ) from None
        raise PluginError(f"{where}: importing {name!r} failed: {_located(err)}") from None
    except SystemExit as err:  # it exited quietly with its own status
        raise PluginError(f"{where}: importing {name!r} called sys.exit({err.code!r})") from None
    except Exception as err:
        raise PluginError(f"{where}: importing {name!r} failed: {_located(err)}") from None


PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _located(err: BaseException) -> str:
    """``Type: message (file, line N)``: the innermost frame of ``err`` outside metalearn (the
    line of the importing module that called into it), else the frame that raised it."""
    message = headline(err)
    frames = traceback.extract_tb(err.__traceback__)
    outside = [
        f
        for f in frames
        if not f.filename.startswith(("<", PACKAGE_DIR + os.sep))  # "<frozen importlib...>"
    ]
    frame = (outside or frames or [None])[-1]
    return message if frame is None else f"{message} ({frame.filename}, line {frame.lineno})"


def user_code_frame(err: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of ``err``'s traceback in a module that registered an algorithm,
    model, task family or RL environment from outside metalearn (a researcher's own code), or
    None: an error raised there (or in library code it called) is the researcher's to fix, told
    in one line.
    """
    files = set().union(*(r.outside_files() for r in GROUPS.values()))
    factories = [f for parts in OTHER_PARTS.values() for f in parts.values()]
    files |= {path for path in map(_outside_source_file, factories) if path}
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename in files]
    return frames[-1] if frames else None


def user_code_error(err: BaseException, selected: dict[str, str] | None = None) -> str | None:
    """One line for an exception that a researcher's own code raised (:func:`user_code_frame`,
    naming the file and line) or that was raised while a run used a part registered from
    outside metalearn (``selected``: the config's ``{"algorithm": name, "model": name, "data":
    name}``, and ``"data.env": name``: :func:`selected_parts`), naming that part; None for any
    other.

    >>> user_code_error(ValueError("bad"), {"algorithm": "maml"}) is None
    True
    """
    head = headline(err)
    frame = user_code_frame(err)
    if frame is not None:
        return f"{head} (in your code: {frame.filename}, line {frame.lineno}, in {frame.name})"
    own = []
    for key, name in (selected or {}).items():
        origin = _outside_origin(key, name)
        if origin is not None:
            own.append(f"{key}={name} ({origin})")
    if not own:
        return None
    return (
        f"{head} (raised while the run used your own {', '.join(own)}: check it against "
        "docs/extending.md)"
    )
