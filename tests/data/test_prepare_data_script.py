"""scripts/prepare_data.py: prepares the named datasets, or exits 2 with a one-line error."""

from __future__ import annotations

import importlib.util
import pathlib

from tests.data.fake_sources import write_cifar

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "prepare_data.py"


def load_script():
    spec = importlib.util.spec_from_file_location("prepare_data", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prepares_the_named_datasets(tmp_path, capsys):
    write_cifar(str(tmp_path / "manual"))
    args = ["cifarfs", "fc100", "--manual-dir", str(tmp_path / "manual")]
    assert load_script().main([*args, "--data-dir", str(tmp_path / "tfds")]) == 0
    out = capsys.readouterr().out
    assert "cifarfs (cifar_fs): train (64, 3, 32, 32, 3), val (16, 3, 32, 32, 3)" in out
    assert "fc100 (fc100): train (60, 3, 32, 32, 3)" in out


def test_missing_source_exits_2_with_one_line(tmp_path, capsys):
    status = load_script().main(
        ["omniglot", "--manual-dir", str(tmp_path / "nowhere"), "--data-dir", str(tmp_path)]
    )
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("error: omniglot_vinyals: data.manual_dir=")
    assert err.count("\n") == 1
