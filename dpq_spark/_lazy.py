"""Module attributes imported on first use (PEP 562), for the package ``__init__`` files."""

from __future__ import annotations

import importlib


def lazy_attributes(namespace: dict, names: dict[str, str]):
    """``(__getattr__, __dir__)`` for a module whose globals are ``namespace``: each attribute
    in ``names`` (name -> module holding it) is imported on first access and then kept."""
    module_name = namespace["__name__"]

    def __getattr__(name: str):
        source = names.get(name)
        if source is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        namespace[name] = value
        return value

    def __dir__():
        return sorted(set(namespace) | set(namespace.get("__all__", ())) | set(names))

    return __getattr__, __dir__
