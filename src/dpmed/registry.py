"""Named registries for the extension points (clip rules, morphologies, aggregators, models,
xcal methods, dataset families, studies).

An extension is one entry: its module registers it (decorator or call) and every consumer —
config schema enums, wildcard patterns, report orderings, rule files — reads the names from
here, in registration order. Lookups of an unknown name raise `ValueError` listing the known
names, like Opacus' accountant registry.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """An ordered name → entry mapping that refuses duplicates and names unknown keys.

    Args:
        kind: what the entries are ("clip rule", "aggregator", ...), used in error messages.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> T:
        """Register `entry` under `name`; a second entry with the same name is an error."""
        if name in self._entries:
            raise ValueError(f"{self.kind} '{name}' is already registered")
        self._entries[name] = entry
        return entry

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of `add`: `@REGISTRY.register("name")`."""

        def decorate(entry: T) -> T:
            return self.add(name, entry)

        return decorate

    def remove(self, name: str) -> T:
        """Unregister `name` (tests that register a toy entry clean up with this)."""
        return self._entries.pop(name)

    def __getitem__(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(self._entries)
            raise ValueError(f"unknown {self.kind} '{name}' (known: {known})") from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> tuple[str, ...]:
        """Registered names in registration order."""
        return tuple(self._entries)

    def items(self) -> list[tuple[str, T]]:
        """(name, entry) pairs in registration order."""
        return list(self._entries.items())

    def pattern(self) -> str:
        """A regex alternation of the names (for Snakemake wildcard constraints)."""
        return "|".join(self._entries)


def resolve(spec: str) -> Any:
    """The object a `"package.module:attribute"` string names, imported only now (so a table of
    such strings costs no imports until an entry is used)."""
    module, _, attribute = spec.partition(":")
    return getattr(importlib.import_module(module), attribute)
