"""Plug-ins by name: what a stage lets users add (advantage estimators, policy losses), registered
in the stage's process or through an entry-point group that every process of the stage loads.

A stage looks a name up when it starts (:meth:`Registry.get`), so a name nobody registered stops
it with an error that lists the registered ones instead of failing at the first group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from importlib import metadata
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Named ``T``s: built-in ones, those registered in this process, and those of the entry-point
    group ``group`` (loaded once, on the first lookup). ``what`` names a ``T`` in errors, ``adder``
    the function that registers one; ``convert(name, obj)`` turns what an entry point or a caller
    hands over into a ``T``. ``lazy=False``: the group is loaded only when the owner calls
    :meth:`load_entry_points` (a registry built per stage, which decides whether it wants them)."""

    def __init__(self, what: str, group: str, adder: str, builtins: dict[str, T],
                 convert: Callable[[str, Any], T] | None = None, *, lazy: bool = True) -> None:
        self.what, self.group, self.adder = what, group, adder
        self._items: dict[str, T] = dict(builtins)
        self._convert = convert or (lambda name, obj: obj)
        self._loaded = not lazy

    def register(self, name: str, obj: Any) -> T:
        """Register ``obj`` under ``name`` (replacing one of that name) and return it."""
        item = self._convert(name, obj)
        self._items[name] = item
        return item

    def load_entry_points(self, found: Iterable[metadata.EntryPoint] | None = None) -> None:
        """Register every entry point of the group (once), or those ``found``."""
        if found is None and self._loaded:
            return
        for entry in metadata.entry_points(group=self.group) if found is None else found:
            self.register(entry.name, entry.load())
        self._loaded = self._loaded or found is None

    def names(self) -> list[str]:
        self.load_entry_points()
        return sorted(self._items)

    def get(self, name: str) -> T:
        """The ``T`` registered as ``name``; ValueError naming the registered ones otherwise."""
        self.load_entry_points()
        item = self._items.get(name)
        if item is None:
            raise ValueError(f"unknown {self.what} {name!r}; registered: {', '.join(sorted(self._items))} "
                             f"(register more with {self.adder} or the {self.group} entry points)")
        return item
