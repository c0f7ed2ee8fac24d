"""Scripts import the installed metalearn (whatever is on the import path), never the checkout
they sit in by editing ``sys.path``."""

import ast
import shutil
import subprocess
import sys

from tests.cli import REPO, checkout_env

SCRIPTS = sorted((REPO / "scripts").glob("*.py"))
# Importing a sibling script (bench.py runs bench_jax.py's functions) is not an import of the
# package; that one form is allowed.
OWN_DIRECTORY = "os.path.dirname(os.path.abspath(__file__))"


def sys_path_edits(path) -> list[str]:
    """The arguments of every ``sys.path.insert/append`` call in ``path``, as source text."""
    edits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("insert", "append")
            and ast.unparse(node.func.value) == "sys.path"
        ):
            edits.append(ast.unparse(node.args[-1]))
    return edits


def test_no_script_puts_the_checkout_on_the_import_path():
    offending = {
        p.name: e for p in SCRIPTS if (e := [a for a in sys_path_edits(p) if a != OWN_DIRECTORY])
    }
    assert not offending, offending


def test_collect_sweep_uses_the_metalearn_on_the_import_path(tmp_path):
    # A copy of the script beside a broken "metalearn": it must import the real one.
    (tmp_path / "scripts").mkdir()
    (tmp_path / "metalearn").mkdir()
    (tmp_path / "metalearn" / "__init__.py").write_text("raise ImportError('the shadow copy')\n")
    script = shutil.copy(REPO / "scripts" / "collect_sweep.py", tmp_path / "scripts")
    result = subprocess.run(
        [sys.executable, script, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path / "scripts",
        env=checkout_env(),
    )
    assert result.returncode == 0, result.stderr
    assert "shadow" not in result.stderr
