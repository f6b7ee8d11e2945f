"""Every module that declares ``__all__`` declares exactly its public classes and functions, and
every name it declares resolves."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import context_ceiling


def _modules() -> list[str]:
    return [
        m.name
        for m in pkgutil.walk_packages(context_ceiling.__path__, "context_ceiling.")
        if not m.name.endswith("__main__")
    ]


def test_declared_exports_match_the_public_definitions() -> None:
    checked = 0
    for name in _modules():
        module = importlib.import_module(name)
        declared = getattr(module, "__all__", None)
        if declared is None:
            continue
        checked += 1
        for export in declared:
            assert hasattr(module, export), f"{name}.__all__ names {export}, which is not there"
        public = {
            n
            for n, obj in vars(module).items()
            if not n.startswith("_")
            and (inspect.isclass(obj) or inspect.isfunction(obj))
            and getattr(obj, "__module__", None) == name
        }
        assert public <= set(declared), (
            f"{name}: public but not in __all__: {public - set(declared)}"
        )
    assert checked >= 5
