"""metalearn.tools.prepare_data: a path setting that names a file, not a directory, is one line."""

import pytest

from tests.cli import error_line, run_tool


@pytest.mark.parametrize("key", ["data.data_dir", "data.manual_dir"])
def test_a_directory_setting_that_names_a_file(tmp_path, key):
    path = tmp_path / "a_file"
    path.write_text("not a directory\n")
    result = run_tool("prepare_data", "data=cifarfs", f"{key}={path}")
    error_line(result, f"{key}={path} is a file, not a directory; give ")
    # A file further up the path (data_dir is created when missing) is refused the same way.
    result = run_tool("prepare_data", "data=cifarfs", f"{key}={path}/sub")
    error_line(result, f"{key}={path}/sub: {path} is a file, not a directory; give ")
