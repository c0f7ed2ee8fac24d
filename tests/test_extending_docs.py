"""docs/extending.md's worked examples run, in order, as written (the site build runs them too,
in a kernel of its own)."""

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def code_blocks(text: str) -> list[str]:
    return re.findall(r"```\{code-cell\} ipython3\n(.*?)```", text, flags=re.S)


def test_every_example_in_extending_md_runs():
    blocks = code_blocks(DOC.read_text())
    assert len(blocks) >= 4  # an algorithm, a dataset, a model, a task family
    namespace: dict = {"__name__": "extending_md"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"{DOC}:block{i}", "exec"), namespace)
        except Exception as err:
            raise AssertionError(f"docs/extending.md code block {i} failed: {err!r}") from err
