"""Every public error class hangs from `broker.errors.GazetteError`, is drawn in the tree of
`broker/errors.py`'s docstring, and has a name no other public error class has."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import broker.errors
from broker.errors import GazetteError

PACKAGES = ("broker", "cluster", "consumer", "gazctl", "gazette", "pipelines")


def public_errors() -> dict[type[BaseException], str]:
    """Each public exception class defined in the packages, and its module."""
    found: dict[type[BaseException], str] = {}
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if info.name.rsplit(".", 1)[-1] == "__main__":  # Runs a command line when imported.
                continue
            module = importlib.import_module(info.name)
            for name, value in vars(module).items():
                if (inspect.isclass(value) and issubclass(value, BaseException)
                        and value.__module__ == module.__name__ and not name.startswith("_")):
                    found[value] = module.__name__
    return found


def test_every_public_error_hangs_from_gazette_error() -> None:
    errors = public_errors()
    assert len(errors) > 100  # The walk found the packages' errors.
    stray = [f"{module}.{cls.__name__}" for cls, module in errors.items() if not issubclass(cls, GazetteError)]
    assert not stray, "public errors not under GazetteError (hang them, or name them _Private):\n" + "\n".join(stray)


def test_no_two_public_errors_share_a_name() -> None:
    by_name: dict[str, list[str]] = {}
    for cls, module in public_errors().items():
        by_name.setdefault(cls.__name__, []).append(module)
    shared = {name: modules for name, modules in by_name.items() if len(modules) > 1}
    assert not shared, f"public errors sharing a name: {shared}"


def test_the_tree_draws_every_public_error() -> None:
    drawn = set(re.findall(r"\b[A-Z][A-Za-z]+\b", broker.errors.__doc__ or ""))
    missing = sorted(cls.__name__ for cls in public_errors() if cls.__name__ not in drawn)
    assert not missing, f"errors missing from the tree in broker/errors.py: {missing}"
