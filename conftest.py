"""Repository-wide pytest settings: doctests of optional-dependency modules skip without them."""

import importlib.util

import pytest

# module -> (the optional package its doctests import, how to install it)
OPTIONAL = {"metalearn/rl/envs/locomotion.py": ("brax", "pip install '.[locomotion]'")}


def pytest_collection_modifyitems(config, items):
    for path, (package, install) in OPTIONAL.items():
        if importlib.util.find_spec(package) is not None:
            continue
        skip = pytest.mark.skip(reason=f"needs {package}: {install}")
        for item in items:
            if item.nodeid.startswith(path):
                item.add_marker(skip)
