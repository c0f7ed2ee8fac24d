"""What a non-editable install (a wheel) ships: every Hydra config and data file the runs read."""

import pathlib

import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _package_data() -> dict[str, list[str]]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return pyproject["tool"]["setuptools"]["package-data"]


def _shipped(package_dir: pathlib.Path, package: str) -> set[str]:
    """The files setuptools takes for ``package``: its package-data globs, expanded as globs."""
    return {
        p.relative_to(package_dir).as_posix()
        for pattern in _package_data()[package]
        for p in package_dir.glob(pattern)
    }


def test_every_config_file_is_package_data():
    conf = ROOT / "metalearn" / "conf"
    yamls = [p.relative_to(conf).as_posix() for p in conf.rglob("*.yaml")]
    assert "config.yaml" in yamls and "experiment/sinusoid_maml.yaml" in yamls
    missing = sorted(set(yamls) - _shipped(conf, "metalearn.conf"))
    assert not missing, f"configs a wheel would leave out (extend package-data): {missing}"


def test_no_config_directory_outside_the_package():
    # One home for the configs: a top-level conf/ would not be installed.
    assert not (ROOT / "conf").exists()
