"""Name -> (config dataclass, factory) registries for the parts a config selects.

Each algorithm, model and task distribution registers itself with a frozen config dataclass
whose fields are exactly the factory's keyword arguments (plus ``name``). Hydra validates a
composed config group against that dataclass, and :func:`build` calls the factory with its
fields, so one dataclass is both the schema and the signature.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Entry:
    config_cls: type
    factory: Callable[..., Any]


class Registry:
    """A named set of (config dataclass, factory) entries, e.g. all algorithms."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, config_cls: type) -> Callable[[Callable], Callable]:
        """Decorator: ``@ALGORITHMS.register("maml", MAMLConfig)`` above the factory."""
        fields = {f.name for f in dataclasses.fields(config_cls)}
        if "name" not in fields:
            raise TypeError(f"{config_cls.__name__} needs a 'name' field")

        def decorate(factory: Callable) -> Callable:
            self._entries[name] = Entry(config_cls, factory)
            return factory

        return decorate

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entry(self, name: str) -> Entry:
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")
        return self._entries[name]

    def build(self, config: Any, *args: Any) -> Any:
        """Call the factory registered under ``config.name`` with ``*args`` and the fields."""
        entry = self.entry(config.name)
        kwargs = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
        kwargs.pop("name")
        return entry.factory(*args, **kwargs)


ALGORITHMS = Registry("algorithm")
MODELS = Registry("model")
TASKS = Registry("task distribution")
