"""Scripts import the installed metalearn (whatever is on the import path), never the checkout
they sit in by editing ``sys.path``."""

import ast

from tests.cli import REPO

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
