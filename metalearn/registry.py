"""Name -> (config dataclass, factory) registries for the parts a config selects.

Each algorithm, model and task family registers itself with a config dataclass, the one home of
its defaults: Hydra validates a composed config group against that dataclass, and
:meth:`Registry.build` hands it to the factory (as ``config=``, or as keyword arguments to a
factory that takes its fields one by one). So one dataclass is both the schema and the
signature.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Entry:
    config_cls: type
    factory: Callable[..., Any]
    info: dict = dataclasses.field(default_factory=dict)  # declarations, e.g. a model's parts


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
        ``outer_step_settings(config) -> str | None``, the settings it uses instead).
        """
        fields = {f.name for f in dataclasses.fields(config_cls)}
        if "name" not in fields:
            raise TypeError(f"{config_cls.__name__} needs a 'name' field")

        def decorate(factory: Callable) -> Callable:
            self._entries[name] = Entry(config_cls, factory, dict(info))
            return factory

        return decorate

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entry(self, name: str) -> Entry:
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")
        return self._entries[name]

    def build(self, config: Any, *args: Any) -> Any:
        """Call the factory registered under ``config.name`` with ``*args`` and the config.

        A factory with a ``config`` parameter gets the dataclass itself (its fields are the one
        home of the defaults); any other gets the fields as keyword arguments.
        """
        entry = self.entry(config.name)
        if "config" in inspect.signature(entry.factory).parameters:
            return entry.factory(*args, config=config)
        kwargs = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
        kwargs.pop("name")
        return entry.factory(*args, **kwargs)


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
TASKS = Registry("task distribution")
