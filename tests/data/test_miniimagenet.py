"""The miniImageNet builder on generated sources in the three layouts researchers have."""

from __future__ import annotations

import os
import shutil

import jax
import numpy as np
import pytest

from metalearn.data.fewshot_builder import load_split_arrays
from metalearn.data.miniimagenet import miniimagenet
from metalearn.data.miniimagenet_builder import MiniImagenetRavi
from metalearn.data.sources import DataSourceError
from tests.data.fake_sources import (
    mini_value,
    truncate,
    write_mini_class_folders,
    write_mini_pickles,
    write_mini_ravi_zip,
)

CLASSES = {"train": 64, "val": 16, "test": 20}


def check_arrays(arrays, per_class=3):
    for split, count in CLASSES.items():
        images = arrays[split].dense()
        assert images.shape == (count, per_class, 84, 84, 3) and images.dtype == np.uint8
        expected = np.array([mini_value(c) for c in range(count)])
        centre = images[:, :, 42, 42, :].astype(int)  # JPEG keeps flat colours within a few
        assert np.abs(centre - expected[:, None, :]).max() <= 4


@pytest.mark.parametrize(
    "write",
    [
        write_mini_ravi_zip,
        lambda d: write_mini_class_folders(d),
        lambda d: write_mini_class_folders(d, as_tar=True),
        write_mini_pickles,
    ],
    ids=["ravi_images_zip", "class_folders", "class_folders_tar_gz", "ren_pickles"],
)
def test_layouts(write, tmp_path):
    write(str(tmp_path / "manual"))
    arrays = load_split_arrays(
        MiniImagenetRavi, data_dir=str(tmp_path / "tfds"), manual_dir=str(tmp_path / "manual")
    )
    check_arrays(arrays)


def test_task_distribution_and_duplicates_across_layouts(tmp_path):
    manual = str(tmp_path / "manual")
    write_mini_ravi_zip(manual)
    write_mini_class_folders(manual)  # the same file names again: counted once
    tasks = miniimagenet(ways=5, num_queries=2, data_dir=str(tmp_path), manual_dir=manual)
    assert {s: a.dense().shape[:2] for s, a in tasks.splits.items()} == {
        "train": (64, 3),
        "val": (16, 3),
        "test": (20, 3),
    }
    assert tasks.input_shape == (84, 84, 3) and tasks.num_outputs == 5
    task = tasks.sample(tasks.splits["train"], jax.random.key(0), 1)
    assert task.support[0].shape == (5, 84, 84, 3) and task.query[1].shape == (10,)


def test_no_manual_dir_says_what_to_get(tmp_path):
    with pytest.raises(DataSourceError) as err:
        miniimagenet(data_dir=str(tmp_path))
    message = str(err.value)
    assert "\n" not in message
    assert "TFDS cannot download miniImageNet" in message and "data.manual_dir" in message


def test_missing_manual_dir(tmp_path):
    with pytest.raises(DataSourceError, match=r"data.manual_dir=.*/nowhere does not exist; get"):
        miniimagenet(data_dir=str(tmp_path), manual_dir=str(tmp_path / "nowhere"))


def test_missing_class(tmp_path):
    manual = tmp_path / "manual"
    write_mini_class_folders(str(manual))
    shutil.rmtree(manual / "test" / "n02110063")
    with pytest.raises(DataSourceError, match=r"no images of class n02110063 \(test split\)"):
        miniimagenet(data_dir=str(tmp_path), manual_dir=str(manual))


def test_class_with_fewer_images(tmp_path):
    manual = tmp_path / "manual"
    write_mini_class_folders(str(manual))
    os.remove(manual / "val" / "n01855672" / "n0185567200000002.jpg")  # the first val class
    with pytest.raises(
        DataSourceError, match=r"class n01855672 has 2 images where most classes have 3"
    ):
        miniimagenet(data_dir=str(tmp_path), manual_dir=str(manual))


def test_corrupt_image_and_truncated_archive(tmp_path):
    manual = tmp_path / "manual"
    write_mini_class_folders(str(manual))
    truncate(str(manual / "train" / "n01532829" / "n0153282900000001.jpg"), 0.3)
    with pytest.raises(DataSourceError, match=r"n0153282900000001.jpg is truncated or corrupt"):
        miniimagenet(data_dir=str(tmp_path / "a"), manual_dir=str(manual))

    zipped = tmp_path / "zipped"
    write_mini_ravi_zip(str(zipped))
    truncate(str(zipped / "mini-imagenet.zip"))
    with pytest.raises(DataSourceError, match=r"mini-imagenet.zip is truncated or corrupt"):
        miniimagenet(data_dir=str(tmp_path / "b"), manual_dir=str(zipped))


def test_invalid_settings_name_the_config_key(tmp_path):
    with pytest.raises(ValueError, match=r"data.ways must be >= 2, got 0"):
        miniimagenet(ways=0, data_dir=str(tmp_path))
