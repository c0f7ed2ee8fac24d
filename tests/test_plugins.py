"""A researcher's own parts from the command line: modules named in METALEARN_PLUGINS."""

import json
import sys
import textwrap

import pytest

from metalearn.registry import ALGORITHMS, PluginError, load_plugins
from metalearn.runner.rundir import saved_steps
from tests.cli import TINY, error_line, run_cli

# An algorithm of the researcher's own, in a module outside the package: first-order MAML
# under another name, registered as docs/extending.md shows.
PLUGIN = textwrap.dedent(
    """
    import dataclasses

    from metalearn.algorithms.maml import FOMAMLConfig, fomaml
    from metalearn.registry import ALGORITHMS


    @dataclasses.dataclass
    class LabFOMAMLConfig(FOMAMLConfig):
        name: str = "lab_fomaml"


    @ALGORITHMS.register("lab_fomaml", LabFOMAMLConfig)
    def lab_fomaml(objective, config=None, **overrides):
        c = dataclasses.replace(config or LabFOMAMLConfig(), **overrides)
        return fomaml(objective, FOMAMLConfig(**{**dataclasses.asdict(c), "name": "fomaml"}))
    """
)


# An outer step on the whole meta-batch written for the five arguments batch_update took before
# the runner began to pass its task batching as a sixth.
OLD_BATCH_UPDATE = textwrap.dedent(
    """
    import dataclasses

    from metalearn.algorithms.maml import FOMAMLConfig, fomaml
    from metalearn.registry import ALGORITHMS


    @dataclasses.dataclass
    class OldConfig(FOMAMLConfig):
        name: str = "old_batch"


    def old_step(meta_params, opt_state, tasks, keys, optimizer):
        return meta_params, opt_state, {}


    @ALGORITHMS.register("old_batch", OldConfig)
    def old_batch(objective, config=None, **overrides):
        learner = fomaml(objective, FOMAMLConfig())
        return learner._replace(batch_update=old_step)
    """
)


@pytest.fixture
def plugin_dir(tmp_path):
    directory = tmp_path / "lab"
    directory.mkdir()
    (directory / "lab_algos.py").write_text(PLUGIN)
    (directory / "broken_algos.py").write_text("import dataclasses\n\nregister(undefined)\n")
    (directory / "exiting_algos.py").write_text("import sys\n\nsys.exit(3)\n")
    (directory / "shadowing_algos.py").write_text(PLUGIN.replace('"lab_fomaml"', '"maml"'))
    (directory / "old_batch_algos.py").write_text(OLD_BATCH_UPDATE)
    return directory


def env_with(plugin_dir, plugins):
    return {"PYTHONPATH": str(plugin_dir), "METALEARN_PLUGINS": plugins}


def test_a_registered_module_runs_from_the_command_line_and_evaluates(plugin_dir, tmp_path):
    run_dir = tmp_path / "run"
    env = env_with(plugin_dir, "lab_algos")
    result = run_cli(*TINY, "algorithm=lab_fomaml", f"hydra.run.dir={run_dir}", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "algorithm:\n  name: lab_fomaml" in (run_dir / "config.yaml").read_text()
    assert json.loads((run_dir / "eval.json").read_text())

    result = run_cli(str(run_dir), "--which", "latest", module="metalearn.evaluate", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    # Without the module the run's algorithm is unknown, and the line says where to name it.
    result = run_cli(str(run_dir), module="metalearn.evaluate", env={"METALEARN_PLUGINS": ""})
    error_line(result, "unknown algorithm 'lab_fomaml'", "METALEARN_PLUGINS")


def test_an_installed_packages_entry_point_is_imported_in_a_sweep(plugin_dir, tmp_path):
    # What `pip install` of a package declaring [project.entry-points."metalearn.plugins"]
    # leaves on the import path: a dist-info directory whose entry_points.txt names the module.
    dist_info = plugin_dir / "lab_pkg-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: lab-pkg\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text("[metalearn.plugins]\nlab = lab_algos\n")
    sweep_dir = tmp_path / "sweep"
    result = run_cli(
        "-m",
        *TINY,
        "algorithm=lab_fomaml",
        "seed=0,1",
        f"hydra.sweep.dir={sweep_dir}",
        env={"PYTHONPATH": str(plugin_dir), "METALEARN_PLUGINS": ""},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for job in ("0_algorithm=lab_fomaml,seed=0", "1_algorithm=lab_fomaml,seed=1"):
        assert (sweep_dir / job / "eval.json").exists(), sorted(p.name for p in sweep_dir.iterdir())


def test_an_unknown_option_names_the_variable(tmp_path):
    result = run_cli(*TINY, "algorithm=lab_fomaml", f"hydra.run.dir={tmp_path}")
    error_line(result, "algorithm=lab_fomaml is not an option", "METALEARN_PLUGINS")


@pytest.mark.parametrize(
    "plugins, fragments",
    [
        ("no_such_module", ["no module named 'no_such_module' on the import path", "PYTHONPATH"]),
        ("lab_algos,broken_algos", ["importing 'broken_algos' failed: NameError", "line 3)"]),
        ("exiting_algos", ["importing 'exiting_algos' called sys.exit(3)"]),  # exit 3, silent
        ("lab_algos.py", ["'lab_algos.py' is not a module name", "my_algos for my_algos.py"]),
        (  # it replaced the library's maml silently
            "shadowing_algos",
            [
                "algorithm 'maml' is already registered by metalearn.algorithms.maml.maml; "
                "register shadowing_algos.lab_fomaml under another name",
            ],
        ),
    ],
)
def test_a_module_that_cannot_be_imported_is_one_line(plugin_dir, tmp_path, plugins, fragments):
    result = run_cli(*TINY, f"hydra.run.dir={tmp_path / 'run'}", env=env_with(plugin_dir, plugins))
    error_line(result, f"METALEARN_PLUGINS={plugins}: ", *fragments)
    assert not (tmp_path / "run").exists()  # refused before Hydra made the run directory
    result = run_cli(str(tmp_path), module="metalearn.evaluate", env=env_with(plugin_dir, plugins))
    error_line(result, f"METALEARN_PLUGINS={plugins}: ", *fragments)


def test_load_plugins_imports_the_named_modules(plugin_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(plugin_dir))
    monkeypatch.setattr(ALGORITHMS, "_entries", dict(ALGORITHMS._entries))  # put back after
    monkeypatch.setenv("METALEARN_PLUGINS", " lab_algos , ")
    try:
        assert "lab_fomaml" not in ALGORITHMS.names()
        assert load_plugins() == ["lab_algos"]
        assert "lab_fomaml" in ALGORITHMS.names()
        monkeypatch.setenv("METALEARN_PLUGINS", "broken_algos")
        with pytest.raises(PluginError, match="broken_algos.py, line 3"):
            load_plugins()
    finally:
        sys.modules.pop("lab_algos", None)


def test_a_batch_update_of_the_old_signature_is_one_line_naming_the_new_one(plugin_dir, tmp_path):
    run_dir = tmp_path / "run"
    env = env_with(plugin_dir, "old_batch_algos")
    result = run_cli(*TINY, "algorithm=old_batch", f"hydra.run.dir={run_dir}", env=env)
    error_line(
        result,
        "algorithm=old_batch: its batch_update must take (meta_params, opt_state, tasks, keys, "
        "optimizer, strategy, hyper)",
        "it takes (meta_params, opt_state, tasks, keys, optimizer)",
    )


# A researcher's mistakes in a part of their own, each a traceback (or, for the regression
# targets, a silently broadcast loss) before: now one line naming what to fix, the traceback
# kept in the run's error.txt where one was raised.
MISTAKES = {
    "no_config": PLUGIN.replace("config=None, **overrides", "").replace(
        "c = dataclasses.replace(config or LabFOMAMLConfig(), **overrides)", "c = LabFOMAMLConfig()"
    ),
    "returns_none": PLUGIN.replace("return fomaml(", "fomaml("),
    "raises": PLUGIN.replace("c = dataclasses", "{}['missing']\n    c = dataclasses"),
}


@pytest.mark.parametrize(
    "mistake, fragments",
    [
        (
            "no_config",
            [
                "algorithm 'lab_fomaml': its factory mistaken.lab_fomaml(objective) cannot be",
                "called as lab_fomaml(<Objective>, config=...)",
                "docs/extending.md",
            ],
        ),
        (
            "returns_none",
            [
                "algorithm=lab_fomaml: its factory returned NoneType, not a "
                "metalearn.algorithms.base.MetaLearner"
            ],
        ),
        ("raises", ["KeyError: 'missing' (in your code: ", "mistaken.py, line ", "error.txt"]),
    ],
)
def test_a_mistake_in_a_researchers_own_algorithm_is_one_line(tmp_path, mistake, fragments):
    (tmp_path / "mistaken.py").write_text(MISTAKES[mistake])
    run_dir = tmp_path / "run"
    env = {"PYTHONPATH": str(tmp_path), "METALEARN_PLUGINS": "mistaken"}
    result = run_cli(*TINY, "algorithm=lab_fomaml", f"hydra.run.dir={run_dir}", env=env)
    error_line(result, *fragments)
    if mistake == "raises":  # nothing lost: the traceback is where the line says
        assert "KeyError: 'missing'" in (run_dir / "error.txt").read_text()


def test_targets_that_would_broadcast_against_the_outputs_are_refused():
    # Outputs (n, 1) against targets (n,) made the mean squared error an (n, n) mean, silently.
    import jax.numpy as jnp

    from metalearn.data.task import supervised_loss_and_metrics

    with pytest.raises(ValueError, match=r"outputs have shape \(4, 1\) and the task's targets"):
        supervised_loss_and_metrics("regression", jnp.zeros((4, 1)), (None, jnp.zeros(4)))
    with pytest.raises(ValueError, match=r"labels \(4, 3\) \(float32\)"):
        supervised_loss_and_metrics("classification", jnp.zeros((4, 3)), (None, jnp.zeros((4, 3))))
    loss, _ = supervised_loss_and_metrics("regression", jnp.ones((4, 1)), (None, jnp.zeros((4, 1))))
    assert float(loss) == 1.0


NUMPY_RANDOM_FAMILY = textwrap.dedent(
    """
    import dataclasses

    import jax.numpy as jnp
    import numpy as np

    from metalearn.data.task import Task, TaskFamily
    from metalearn.registry import TASKS


    @dataclasses.dataclass
    class LinesConfig:
        name: str = "np_lines"


    @TASKS.register("np_lines", LinesConfig)
    def np_lines(config=None):
        def sample(split_arrays, key, shots):
            slope = np.random.normal()  # once, when traced: every task of every step is this one
            x = jnp.asarray(np.random.uniform(-1, 1, (shots + 10, 1)), jnp.float32)
            return Task((x[:shots], slope * x[:shots]), (x[shots:], slope * x[shots:]))

        splits = {"train": {}, "val": {}, "test": {}}
        return TaskFamily(splits, sample, (1,), num_outputs=1, kind="regression")
    """
)


def test_a_sampler_drawing_with_numpy_random_is_refused_before_training(tmp_path):
    # It trained and tested on one task, silently (the step is traced once).
    (tmp_path / "np_lines.py").write_text(NUMPY_RANDOM_FAMILY)
    run_dir = tmp_path / "run"
    env = {"PYTHONPATH": str(tmp_path), "METALEARN_PLUGINS": "np_lines"}
    result = run_cli(*TINY, "data=np_lines", f"hydra.run.dir={run_dir}", env=env)
    error_line(
        result,
        "data=np_lines: two training tasks sampled at the start are the same task for two "
        "different keys: draw every random number from the key the sampler is given",
    )
    assert saved_steps(str(run_dir)) == []  # refused before the first step


EVALUATE_OF_ONE_VALUE = textwrap.dedent(
    """
    import dataclasses
    import os

    from metalearn.algorithms.maml import FOMAMLConfig, fomaml
    from metalearn.registry import ALGORITHMS


    @dataclasses.dataclass
    class LabFOMAMLConfig(FOMAMLConfig):
        name: str = "lab_fomaml"


    @ALGORITHMS.register("lab_fomaml", LabFOMAMLConfig)
    def lab_fomaml(objective, config=None):
        learner = fomaml(objective, FOMAMLConfig(inner_lr=config.inner_lr))
        if not os.environ.get("ONE_VALUE"):
            return learner

        def evaluate(params, task, ctx, steps):  # one value, whatever the steps asked for
            return {k: v[:1] for k, v in learner.evaluate(params, task, ctx, steps).items()}

        return learner._replace(evaluate=evaluate)
    """
)


def test_evaluate_names_the_researchers_part_when_the_library_fails_on_what_it_returned(tmp_path):
    # The evaluation phase of `evaluate` gave the library's IndexError as a traceback.
    (tmp_path / "one_value.py").write_text(EVALUATE_OF_ONE_VALUE)
    run_dir = tmp_path / "run"
    env = {"PYTHONPATH": str(tmp_path), "METALEARN_PLUGINS": "one_value"}
    trained = run_cli(*TINY, "algorithm=lab_fomaml", f"hydra.run.dir={run_dir}", env=env)
    assert trained.returncode == 0, trained.stderr[-3000:]
    result = run_cli(
        str(run_dir), "--which", "init", module="metalearn.evaluate", env={**env, "ONE_VALUE": "1"}
    )
    error_line(
        result,
        "IndexError: ",
        "(raised while the run used your own algorithm=lab_fomaml (one_value.lab_fomaml): "
        "check it against docs/extending.md)",
    )
