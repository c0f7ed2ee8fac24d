"""The README's quickstart runs as written."""

from pathlib import Path


def test_readme_quickstart_runs():
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(code, "README.md quickstart", "exec"), namespace)
    assert namespace["meta_grad"].shape == (3,)
