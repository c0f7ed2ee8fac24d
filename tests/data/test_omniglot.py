"""The Omniglot builder and task distribution, on generated archives and on the real ones."""

from __future__ import annotations

import os
import pathlib
import zipfile

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from metalearn.data import sources
from metalearn.data.fewshot_builder import load_split_arrays
from metalearn.data.omniglot import omniglot
from metalearn.data.omniglot_builder import OmniglotVinyals
from metalearn.data.sources import DataSourceError
from tests.data.fake_sources import omniglot_value, truncate, write_omniglot

REAL_DIR = pathlib.Path(__file__).resolve().parents[3] / "shared" / "data" / "omniglot"
CLASSES = {"train": 1028, "val": 172, "test": 423}


@pytest.fixture(scope="module")
def fake_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("omniglot_manual")
    order = write_omniglot(str(directory))
    return directory, order


@pytest.fixture(scope="module")
def prepared(fake_dir, tmp_path_factory):
    """The fake archives prepared once: (data_dir, split arrays, split class order)."""
    directory, order = fake_dir
    data_dir = str(tmp_path_factory.mktemp("tfds"))
    arrays = load_split_arrays(OmniglotVinyals, data_dir=data_dir, manual_dir=str(directory))
    return data_dir, arrays, order


def test_builder_keeps_the_split_classes_in_order_at_28x28(prepared):
    data_dir, arrays, order = prepared
    for split, count in CLASSES.items():
        images = arrays[split].dense()
        assert images.shape == (count, 3, 28, 28, 1) and images.dtype == np.uint8
        expected = np.array([[omniglot_value(c, e) for e in range(3)] for c in range(count)])
        np.testing.assert_array_equal(images[:, :, 14, 14, 0], expected)
        assert images.min((2, 3, 4)).tolist() == images.max((2, 3, 4)).tolist()  # uniform
    builder = OmniglotVinyals(data_dir=data_dir)
    source = builder.as_data_source("val")
    assert [source[i]["class_name"].decode() for i in (0, 171)] == [
        order["val"][0],
        order["val"][171],
    ]
    assert builder.info.splits["train"].num_examples == 1028


def test_task_distribution_inverts_and_rotates_into_classes(prepared):
    data_dir, arrays, _ = prepared
    tasks = omniglot(ways=5, num_queries=2, data_dir=data_dir)  # reuses the prepared data
    sizes = {split: a.num_classes for split, a in tasks.splits.items()}
    assert sizes == {"train": 4112, "val": 688, "test": 1692}
    assert tasks.input_shape == (28, 28, 1) and tasks.num_outputs == 5
    train, source = tasks.splits["train"].dense(), arrays["train"].dense()
    np.testing.assert_array_equal(train[:1028], 255 - source)
    np.testing.assert_array_equal(train[1028:2056], np.rot90(255 - source, 1, (2, 3)))
    np.testing.assert_array_equal(train[3084:], np.rot90(255 - source, 3, (2, 3)))
    task = tasks.sample(tasks.splits["test"], jax.random.key(0), 1)
    assert task.support[0].shape == (5, 28, 28, 1) and task.query[0].shape == (10, 28, 28, 1)
    only_two = omniglot(ways=5, num_queries=2, rotations=(0, 180), data_dir=data_dir)
    assert only_two.splits["val"].num_classes == 2 * 172


def test_online_path_downloads_the_official_archives(fake_dir, tmp_path, monkeypatch):
    directory, _ = fake_dir
    asked = []

    def download(self, urls):
        asked.append(urls)
        return {k: directory / os.path.basename(url) for k, url in urls.items()}

    monkeypatch.setattr(sources, "resolve_host", lambda host: None)
    monkeypatch.setattr(tfds.download.DownloadManager, "download", download)
    arrays = load_split_arrays(OmniglotVinyals, data_dir=str(tmp_path))
    assert arrays["test"].dense().shape == (423, 3, 28, 28, 1)
    assert sorted(asked[0].values()) == [
        "https://github.com/brendenlake/omniglot/raw/master/python/images_background.zip",
        "https://github.com/brendenlake/omniglot/raw/master/python/images_evaluation.zip",
    ]


def unresolvable(host):
    raise OSError(f"[Errno -2] Name or service not known: {host}")


def test_offline_without_manual_dir_fails_fast_and_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "resolve_host", unresolvable)
    with pytest.raises(DataSourceError) as err:
        omniglot(data_dir=str(tmp_path))
    message = str(err.value)
    assert "\n" not in message
    assert "cannot reach github.com (OSError" in message
    assert "if offline, download images_background.zip and images_evaluation.zip" in message
    assert "data.manual_dir" in message


def test_failed_download_says_what_to_do(tmp_path, monkeypatch):
    def download(self, urls):
        raise ConnectionError("Max retries exceeded")

    monkeypatch.setattr(sources, "resolve_host", lambda host: None)
    monkeypatch.setattr(tfds.download.DownloadManager, "download", download)
    with pytest.raises(DataSourceError, match=r"images_evaluation.zip failed \(ConnectionError"):
        omniglot(data_dir=str(tmp_path))


def test_missing_manual_dir(tmp_path):
    with pytest.raises(DataSourceError) as err:
        omniglot(data_dir=str(tmp_path / "tfds"), manual_dir=str(tmp_path / "nowhere"))
    message = str(err.value)
    assert "\n" not in message
    assert f"data.manual_dir={tmp_path / 'nowhere'} does not exist" in message
    assert "download images_background.zip and images_evaluation.zip from https://" in message
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataSourceError, match=r"data.manual_dir=.*/empty is empty; download"):
        omniglot(data_dir=str(tmp_path / "tfds"), manual_dir=str(tmp_path / "empty"))


def test_missing_archive(fake_dir, tmp_path):
    directory, _ = fake_dir
    manual = tmp_path / "manual"
    manual.mkdir()
    (manual / "images_background.zip").write_bytes(
        (directory / "images_background.zip").read_bytes()
    )
    with pytest.raises(DataSourceError, match=r"images_evaluation.zip not found; download it"):
        omniglot(data_dir=str(tmp_path / "tfds"), manual_dir=str(manual))


def test_truncated_archive(fake_dir, tmp_path):
    directory, _ = fake_dir
    manual = tmp_path / "manual"
    manual.mkdir()
    for name in ("images_background.zip", "images_evaluation.zip"):
        (manual / name).write_bytes((directory / name).read_bytes())
    truncate(str(manual / "images_evaluation.zip"))
    with pytest.raises(DataSourceError) as err:
        omniglot(data_dir=str(tmp_path / "tfds"), manual_dir=str(manual))
    message = str(err.value)
    assert "\n" not in message
    assert "images_evaluation.zip is truncated or corrupt (BadZipFile" in message
    assert "download it from https://github.com/brendenlake/omniglot" in message


def test_corrupt_image_inside_the_archive(fake_dir, tmp_path):
    directory, _ = fake_dir
    manual = tmp_path / "manual"
    manual.mkdir()
    (manual / "images_evaluation.zip").write_bytes(
        (directory / "images_evaluation.zip").read_bytes()
    )
    with (
        zipfile.ZipFile(directory / "images_background.zip") as src,
        zipfile.ZipFile(manual / "images_background.zip", "w") as dst,
    ):
        for i, info in enumerate(src.infolist()):
            data = src.read(info)
            dst.writestr(info, b"not a png" if i == 5 else data)
    with pytest.raises(DataSourceError, match=r"\.png is truncated or corrupt \(Unidentified"):
        omniglot(data_dir=str(tmp_path / "tfds"), manual_dir=str(manual))


def test_missing_split_character(tmp_path):
    write_omniglot(str(tmp_path / "manual"), per_class=2, drop="Alphabet_of_the_Magi/character07")
    with pytest.raises(DataSourceError) as err:
        omniglot(data_dir=str(tmp_path / "tfds"), manual_dir=str(tmp_path / "manual"))
    assert "character Alphabet_of_the_Magi/character07 of the train split is missing from" in str(
        err.value
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(ways=1), r"data.ways must be >= 2, got 1"),
        (dict(num_queries=0), r"data.num_queries must be >= 1, got 0"),
        (dict(rotations=(0, 45)), r"data.rotations must be distinct angles"),
        (dict(rotations=()), r"data.rotations must be distinct angles"),
        (
            dict(ways=1000, num_queries=1),
            r"data.ways=1000 exceeds the 688 classes of the omniglot val split",
        ),
        (dict(num_queries=3), r"data.num_queries=3 leaves no support examples"),
    ],
)
def test_invalid_settings_name_the_config_key(prepared, kwargs, message):
    data_dir, _, _ = prepared
    with pytest.raises(ValueError, match=message):
        omniglot(data_dir=data_dir, **kwargs)


@pytest.mark.skipif(
    not (REAL_DIR / "images_background.zip").exists(),
    reason=f"the real Omniglot archives are not at {REAL_DIR}",
)
def test_real_archives(tmp_path):
    tasks = omniglot(ways=20, num_queries=15, data_dir=str(tmp_path), manual_dir=str(REAL_DIR))
    shapes = {split: a.dense().shape for split, a in tasks.splits.items()}
    assert shapes == {
        "train": (4112, 20, 28, 28, 1),
        "val": (688, 20, 28, 28, 1),
        "test": (1692, 20, 28, 28, 1),
    }
    images = tasks.splits["train"].dense()[:1028]
    ink = (images > 127).mean()
    assert 0.05 < ink < 0.3  # strokes on an empty (0) background after inversion
    task = tasks.sample(tasks.splits["train"], jax.random.key(0), 5)
    assert task.support[0].shape == (100, 28, 28, 1) and task.query[0].shape == (300, 28, 28, 1)
