"""TensorFlow Datasets (and TensorFlow) and PIL are imported only when an image dataset is built:
never by ``import metalearn``, the algorithms, the runner, or a whole sinusoid run. orbax only
when a run first touches a checkpoint. tensorboardX and torch never (a run writes its event files
itself: tensorboardX imports torch when it is installed, 1.5 s of every run's start)."""

import sys
import textwrap

from tests.cli import checkout_env, finished

HEAVY = ("tensorflow_datasets", "tensorflow", "PIL")
NEVER = ("tensorboardX", "torch")


def run_python(code: str, tmp_path) -> str:
    """Run ``code`` in a fresh interpreter (this checkout first on the path); its stdout."""
    result = finished(
        [sys.executable, "-c", textwrap.dedent(code)], 600, cwd=tmp_path, env=checkout_env()
    )
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    return result.stdout


def loaded(stdout: str) -> list[str]:
    return [line.split()[1] for line in stdout.splitlines() if line.startswith("loaded ")]


def report(names: tuple[str, ...] = HEAVY) -> str:
    """Code printing ``loaded NAME`` for each of ``names`` the interpreter has imported."""
    return f"""
import sys
for name in {names!r}:
    if name in sys.modules:
        print("loaded", name)
"""


def test_importing_the_library_imports_no_tfds_orbax_or_torch(tmp_path):
    # A refused command line answers without their import time (orbax's 0.2 s comes with the
    # first checkpoint).
    code = (
        "import metalearn, metalearn.algorithms, metalearn.data, metalearn.models\n"
        "import metalearn.config, metalearn.train, metalearn.evaluate, metalearn.runner.loop\n"
        "import metalearn.sweep\n" + report(HEAVY + NEVER + ("orbax.checkpoint",))
    )
    assert loaded(run_python(code, tmp_path)) == []


def test_a_sinusoid_run_imports_no_tfds_and_no_torch(tmp_path):
    code = f"""
    import runpy, sys
    sys.argv = ["train", "+experiment=sinusoid_maml", "+debug=tiny",
                "hydra.run.dir={tmp_path / "run"}"]
    try:
        runpy.run_module("metalearn.train", run_name="__main__")
    except SystemExit as exit:
        assert not exit.code, exit.code
    """
    stdout = run_python(textwrap.dedent(code) + report(HEAVY + NEVER), tmp_path)
    assert (tmp_path / "run" / "eval.json").exists()
    assert any((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
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
    stdout = run_python(textwrap.dedent(code) + report(), tmp_path)
    assert "refused: omniglot_vinyals: data.manual_dir=" in stdout
    assert "tensorflow_datasets" in loaded(stdout)
