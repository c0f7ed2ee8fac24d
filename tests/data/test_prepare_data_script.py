"""metalearn.tools.prepare_data: prepares the named datasets, or exits 2 with a one-line error."""

from __future__ import annotations

import doctest

from metalearn.tools import prepare_data
from tests.cli import REPO, run_tool
from tests.data.fake_sources import write_cifar


def test_prepares_the_named_datasets(tmp_path, capsys):
    write_cifar(str(tmp_path / "manual"))
    args = ["data=cifarfs,fc100", f"data.manual_dir={tmp_path / 'manual'}"]
    assert prepare_data.main([*args, f"data.data_dir={tmp_path / 'tfds'}"]) == 0
    out = capsys.readouterr().out
    assert "cifarfs (cifar_fs): train (64, 3, 32, 32, 3), val (16, 3, 32, 32, 3)" in out
    assert "fc100 (fc100): train (60, 3, 32, 32, 3)" in out


def test_missing_source_exits_2_with_one_line(tmp_path, capsys):
    status = prepare_data.main(
        ["data=omniglot", f"data.manual_dir={tmp_path / 'nowhere'}", f"data.data_dir={tmp_path}"]
    )
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("error: omniglot_vinyals: data.manual_dir=")
    assert err.count("\n") == 1


def test_the_documented_spelling_is_accepted_and_others_are_refused(tmp_path):
    """The documented command spells settings as a run does; no argument is a one-line error."""
    page = (REPO / "docs" / "command-line.md").read_text()
    command = page.split("`python -m metalearn.tools.prepare_data ", 1)[1].split("`", 1)[0].split()
    assert command[0] == "data=omniglot" and command[1].startswith("data.manual_dir=")
    for argv in ([], ["omniglot", "--manual-dir", str(tmp_path)], ["data=nosuch"]):
        result = run_tool("prepare_data", *argv)
        assert result.returncode == 2, (argv, result.stderr)
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
        assert "data=" in result.stderr and "Traceback" not in result.stderr


def test_docstring_examples():
    result = doctest.testmod(prepare_data, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_a_setting_given_twice_is_refused(capsys):
    # `data=omniglot data=cifarfs` prepared cifarfs only: the first was dropped silently.
    assert prepare_data.main(["data=omniglot", "data=cifarfs"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: data is given twice")
    assert "data=NAME,NAME" in err
    # An empty name in the list is named as one (it read "unknown ; known: ...").
    assert prepare_data.main(["data=omniglot,"]) == 2
    assert "unknown ''; known: omniglot" in capsys.readouterr().err


def test_a_dataset_without_files_needs_no_preparation(capsys):
    # `data=sinusoid` said "unknown sinusoid; known: omniglot, ...", though a run takes it.
    for name in ("sinusoid", "nav2d", "omniglot,cheetah_dir"):
        assert prepare_data.main([f"data={name}"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "needs no preparation" in err, err
