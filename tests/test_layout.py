"""The package's shape: short modules, imports that run one way, no private Hydra API."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted([*(ROOT / "metalearn").rglob("*.py"), *(ROOT / "hydra_plugins").rglob("*.py")])
MAX_LINES = 450
ENTRIES = ("metalearn.train", "metalearn.evaluate")  # metalearn.cli is the helpers every CLI shares


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports inside functions included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_package_is_found():
    assert len(MODULES) > 50
    assert "metalearn.runner.loop" in map(module_name, MODULES)


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_no_module_is_longer_than_a_sitting(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES


def uses(path: Path, prefix: str) -> list[str]:
    return sorted(n for n in imported(path) if n == prefix or n.startswith(prefix + "."))


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_imports_run_one_way(path):
    name = module_name(path)
    assert uses(path, "hydra._internal") == []
    if name.startswith("metalearn.runner"):
        assert uses(path, "metalearn.tools") == []
    if name.startswith(("metalearn.runner", "metalearn.tools")):
        assert [n for entry in ENTRIES for n in uses(path, entry)] == []


def test_the_import_check_sees_lazy_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def f():\n    from hydra._internal.utils import x\n    import metalearn.train\n"
    )
    assert uses(probe, "hydra._internal") == ["hydra._internal.utils", "hydra._internal.utils.x"]
    assert uses(probe, "metalearn.train") == ["metalearn.train"]
