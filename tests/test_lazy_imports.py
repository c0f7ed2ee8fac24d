"""TensorFlow Datasets (and TensorFlow) and PIL are imported only when an image dataset is built:
never by ``import metalearn``, the algorithms, the runner, or a whole sinusoid run. tensorboardX
(which imports torch when torch is installed) only when a run writes its metrics."""

import sys
import textwrap

from tests.cli import checkout_env, finished

HEAVY = ("tensorflow_datasets", "tensorflow", "PIL")


def run_python(code: str, tmp_path) -> str:
    """Run ``code`` in a fresh interpreter (this checkout first on the path); its stdout."""
    result = finished(
        [sys.executable, "-c", textwrap.dedent(code)], 600, cwd=tmp_path, env=checkout_env()
    )
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    return result.stdout


def loaded(stdout: str) -> list[str]:
    return [line.split()[1] for line in stdout.splitlines() if line.startswith("loaded ")]


REPORT = f"""
import sys
for name in {HEAVY!r}:
    if name in sys.modules:
        print("loaded", name)
"""


def test_importing_the_library_imports_no_tfds(tmp_path):
    code = (
        "import metalearn, metalearn.algorithms, metalearn.data, metalearn.models\n"
        "import metalearn.config, metalearn.train, metalearn.evaluate, metalearn.runner.loop\n"
        + REPORT
    )
    assert loaded(run_python(code, tmp_path)) == []


def test_importing_the_entry_points_imports_no_tensorboardx(tmp_path):
    # A config error or an evaluation answers without tensorboardX's (and torch's) import time.
    code = """
    import sys
    import metalearn, metalearn.train, metalearn.evaluate, metalearn.runner.loop
    for name in ("tensorboardX", "torch"):
        if name in sys.modules:
            print("loaded", name)
    """
    assert loaded(run_python(code, tmp_path)) == []


def test_a_sinusoid_run_imports_no_tfds(tmp_path):
    code = f"""
    import runpy, sys
    sys.argv = ["train", "+experiment=sinusoid_maml", "+debug=tiny",
                "hydra.run.dir={tmp_path / "run"}"]
    try:
        runpy.run_module("metalearn.train", run_name="__main__")
    except SystemExit as exit:
        assert not exit.code, exit.code
    """
    stdout = run_python(textwrap.dedent(code) + REPORT, tmp_path)
    assert (tmp_path / "run" / "eval.json").exists()
    assert loaded(stdout) == []


def test_building_an_image_dataset_imports_tfds(tmp_path):
    # The lazy import happens: the family's builder needs TFDS (here it stops at the missing
    # source, after importing it).
    code = f"""
    from metalearn.data.omniglot import omniglot
    from metalearn.data.sources import DataSourceError
    try:
        omniglot(manual_dir="{tmp_path / "missing"}", data_dir="{tmp_path / "tfds"}")
    except DataSourceError as err:
        print("refused:", err)
    """
    stdout = run_python(textwrap.dedent(code) + REPORT, tmp_path)
    assert "refused: omniglot_vinyals: data.manual_dir=" in stdout
    assert "tensorflow_datasets" in loaded(stdout)
