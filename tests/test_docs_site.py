"""The documentation site builds from the checkout with warnings as errors (its example pages
executed), every public name has a reference entry, and the built pages render in a browser."""

from __future__ import annotations

import html
import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli import checkout_env, finished

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BUILD_LIMIT_S = 1200  # a safety limit only: the build takes about two minutes on 2 cores

for needed in ("sphinx", "myst_nb", "sphinx_book_theme"):
    pytest.importorskip(needed, reason="the site needs the docs extra: pip install '.[docs]'")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
    command += [str(DOCS), str(out), "-d", str(out / ".doctrees")]
    # This checkout first on the import path, for the examples' commands too (subprocesses of
    # the notebook kernel inherit it), as tests/cli.py runs every command.
    env = checkout_env()
    built = finished(command, BUILD_LIMIT_S, cwd=ROOT, env=env)
    report = f"{built.stdout[-4000:]}\n{built.stderr[-8000:]}"
    assert built.returncode == 0, f"the site build failed:\n{report}"
    return out


def documented_names(site: Path) -> set[str]:
    from sphinx.util.inventory import InventoryFile

    with open(site / "objects.inv", "rb") as stream:
        inventory = InventoryFile.load(stream, "", lambda base, uri: uri)
    return {name for kind, names in inventory.items() if kind.startswith("py:") for name in names}


def docs_conf():
    sys.path.insert(0, str(DOCS))
    try:
        return importlib.import_module("conf")
    finally:
        sys.path.remove(str(DOCS))


def test_every_public_name_has_a_reference_entry(site):
    conf = docs_conf()
    names = documented_names(site)
    # A name re-exported by a package is documented once, under the package: the entry counts
    # for every module that exports the same object.
    under_public = [name for name in names if name.rpartition(".")[0] in conf.PUBLIC_MODULES]
    entries = {id(value) for value in map(conf.locate, under_public) if value is not None}
    missing = []
    for module_name in conf.PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for attr in conf.public_names(module_name):
            if f"{module_name}.{attr}" not in names and id(getattr(module, attr)) not in entries:
                missing.append(f"{module_name}.{attr}")
    assert not missing, f"public names without a reference entry: {missing}"
    assert {"metalearn.maml_loss", "metalearn.algorithms.maml", "metalearn.runner.resolve"} <= names


def test_the_settings_page_lists_every_trainer_setting(site):
    import dataclasses

    from metalearn.config import TrainerConfig

    page = (site / "command-line.html").read_text()
    for field in dataclasses.fields(TrainerConfig):
        assert f"trainer.{field.name}" in page, field.name
    assert "algorithm.inner_lr" in page and "model=conv4" in page


def test_the_example_pages_show_their_executed_output(site):
    started = (site / "getting-started.html").read_text()
    assert "shots," in started and "Traceback" not in started  # the tiny run's eval.json, read
    sweeps = html.unescape((site / "sweeps.html").read_text())
    assert len(re.findall(r"shots, 1 steps: mse \d", sweeps)) == 4  # four runs of one program


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium: apt-get install chromium")
@pytest.mark.parametrize(
    ("page", "title", "entry"),
    [("index.html", "metalearn", "Getting started"), ("api/core.html", "metalearn", "maml_loss")],
)
def test_the_built_pages_render_in_a_browser(site, tmp_path, page, title, entry):
    url = (site / page).as_uri()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"]
    dom = finished([CHROMIUM, *flags, "--dump-dom", url], 180)
    assert dom.returncode == 0, dom.stderr[-2000:]
    found_title = re.search(r"<title>(.*?)</title>", dom.stdout, flags=re.S)
    assert found_title and title in html.unescape(found_title.group(1)), dom.stdout[:500]
    assert entry in html.unescape(dom.stdout)
    shot = tmp_path / "page.png"
    taken = subprocess.run(
        [CHROMIUM, *flags, f"--screenshot={shot}", url], capture_output=True, timeout=180
    )
    assert taken.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 10_000  # a rendered page, not a blank one
