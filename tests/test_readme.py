"""The README's quickstart runs as written."""

from pathlib import Path


def test_readme_quickstart_runs():
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(code, "README.md quickstart", "exec"), namespace)
    assert namespace["meta_grad"].shape == (3,)


def test_every_python_block_of_the_readme_runs():
    # In order, in one namespace (a block may use the names of the blocks before it). The longer
    # examples live in docs/, whose pages run when the site builds (tests/test_docs_site.py).
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in readme.split("```python\n")[1:]]
    namespace: dict = {}
    for number, code in enumerate(blocks):
        exec(compile(code, f"README.md python block {number}", "exec"), namespace)
    assert len(blocks) >= 1
