"""What a non-editable install (a wheel) ships: every Hydra config and data file the runs read,
under the distribution name ``metalearn-jax`` with the import package ``metalearn``."""

import email.parser
import pathlib
import re
import shutil
import sys
import zipfile

import pytest
import tomllib

import metalearn
from tests.cli import finished

ROOT = pathlib.Path(__file__).resolve().parents[1]
# PyPI's "metalearn" (0.6.2) and "parallel-metalearn" are other projects, and both install a
# top-level package named metalearn: ours is published as metalearn-jax.
DIST = "metalearn-jax"


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


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _canonical(name: str) -> str:
    """A distribution name as the index compares names (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_distribution_is_metalearn_jax_and_the_package_metalearn():
    project = _pyproject()["project"]
    assert project["name"] == DIST
    assert _canonical(project["name"]) not in {"metalearn", "parallel-metalearn"}
    include = _pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    assert include == ["metalearn*", "hydra_plugins*"]
    assert project["version"] == metalearn.__version__


# Where users read install advice: the docs, the messages of the package, the tests' skip reasons,
# the scripts and CI. Data files under experiments/ are left out; their READMEs are read.
HINT_SUFFIXES = {".md", ".py", ".toml", ".sh", ".yaml", ".txt", ""}
# "pip install [-e|--upgrade ...] ['"]NAME[extras]": NAME "." is a checkout.
PIP_INSTALL = re.compile(r"pip install((?:\s+--?[\w-]+)*)\s+['\"]?([\w.-]*)(\[[^\]'\"`]*\])?")
# A requirement with extras whatever precedes it: 'metalearn[plot]', `metalearn_jax[test]`.
QUOTED_EXTRA = re.compile(r"['\"`]([\w.-]*metalearn[\w.-]*)\[")


def _hint_files() -> list[pathlib.Path]:
    files = [
        ROOT / "README.md",
        ROOT / "pyproject.toml",
        ROOT / "conftest.py",
        ROOT / ".ci" / "run",
    ]
    for folder in ("docs", "metalearn", "tests", "scripts", "experiments"):
        files += [
            p
            for p in (ROOT / folder).rglob("*")
            if p.is_file()
            and p.suffix in HINT_SUFFIXES
            and "__pycache__" not in p.parts
            and (folder != "experiments" or p.suffix == ".md")
        ]
    return [p for p in files if p.exists() and p.resolve() != pathlib.Path(__file__).resolve()]


def test_every_install_hint_names_metalearn_jax_or_the_checkout():
    extras = set(_pyproject()["project"]["optional-dependencies"])
    wrong, unknown, seen = [], [], 0
    for path in _hint_files():
        text = path.read_text(errors="replace")
        where = path.relative_to(ROOT).as_posix()
        for m in PIP_INSTALL.finditer(text):
            name, requested = m.group(2), m.group(3)
            ours = name == "." or _canonical(name).startswith("metalearn")
            ours = ours or _canonical(name) == "parallel-metalearn"
            if not ours:
                continue  # torch, a wheel directory, ...
            seen += 1
            if name not in (".", DIST):
                wrong.append(f"{where}: {m.group(0)}")
            for extra in (requested or "[]")[1:-1].split(","):
                if extra.strip() and extra.strip() not in extras:
                    unknown.append(f"{where}: {m.group(0)}")
        wrong += [
            f"{where}: {m.group(0)}" for m in QUOTED_EXTRA.finditer(text) if m.group(1) != DIST
        ]
    assert seen > 10, "the scan found almost no install hints: is PIP_INSTALL still right?"
    assert not wrong, f"install hints naming another distribution than {DIST}: {wrong}"
    assert not unknown, f"install hints naming an extra pyproject.toml lacks: {unknown}"


def test_the_plot_hint_gives_the_published_name_and_the_checkout(monkeypatch, capsys):
    from metalearn.tools import require_matplotlib

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    with pytest.raises(SystemExit) as exited:
        require_matplotlib()
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"pip install '{DIST}[plot]'" in err and "pip install '.[plot]'" in err, err


def test_the_wheel_is_metalearn_jax_and_installs_the_package_metalearn(tmp_path):
    # Built from a copy of what the wheel is made of, so that the checkout gets no build/ or
    # *.egg-info. About 3 s with pip's cache of the build requirements (setuptools, wheel).
    src = tmp_path / "src"
    src.mkdir()
    for path in [ROOT / "pyproject.toml", ROOT / "README.md", *ROOT.glob("LICEN[CS]E*")]:
        shutil.copy2(path, src / path.name)
    for package in ("metalearn", "hydra_plugins"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "wheels"
    result = finished(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(src), "-w", str(out)], 600
    )
    output = result.stdout + result.stderr
    if result.returncode and ("No module named pip" in output or "build dependencies" in output):
        pytest.skip(
            f"cannot build a wheel here (no pip, or no index for setuptools): {output[-500:]}"
        )
    assert result.returncode == 0, output
    (wheel,) = out.glob("*.whl")
    assert wheel.name.startswith(DIST.replace("-", "_") + "-"), wheel.name
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (dist_info,) = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
        metadata = email.parser.Parser().parsestr(zf.read(f"{dist_info}/METADATA").decode())
        top_level = zf.read(f"{dist_info}/top_level.txt").decode().split()
    assert metadata["Name"] == DIST
    assert metadata["Version"] == metalearn.__version__
    assert {"test", "plot", "locomotion"} <= set(metadata.get_all("Provides-Extra"))
    # metalearn, and its launcher in Hydra's plugin namespace (no package of that name itself)
    assert sorted(top_level) == ["hydra_plugins", "metalearn"]
    assert "metalearn/__init__.py" in names and "metalearn/conf/config.yaml" in names
    assert "hydra_plugins/metalearn_launcher/vectorized_launcher.py" in names
    assert "hydra_plugins/__init__.py" not in names
    assert {n.split("/")[0] for n in names} == {"metalearn", "hydra_plugins", dist_info}
