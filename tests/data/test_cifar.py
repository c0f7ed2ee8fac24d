"""CIFAR-FS and FC100 from a generated ``cifar-100-python.tar.gz`` in the real layout."""

from __future__ import annotations

import tarfile

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from metalearn.data import sources
from metalearn.data.cifar import cifarfs, fc100
from metalearn.data.cifar_builder import CifarFs, Fc100
from metalearn.data.fewshot_builder import load_split_arrays
from metalearn.data.sources import DataSourceError, split_json
from tests.data.fake_sources import cifar_names, truncate, write_cifar


@pytest.fixture(scope="module")
def manual_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("cifar_manual")
    write_cifar(str(directory))
    return directory


def check(images: np.ndarray, fine_ids: list[int], coarse_ids: list[int]):
    assert images.shape == (len(fine_ids), 3, 32, 32, 3) and images.dtype == np.uint8
    np.testing.assert_array_equal(images[:, :, 5, 7, 0], np.repeat([fine_ids], 3, 0).T)
    np.testing.assert_array_equal(images[:, :, 5, 7, 1], np.tile([0, 1, 2], (len(fine_ids), 1)))
    np.testing.assert_array_equal(images[:, :, 5, 7, 2], np.repeat([coarse_ids], 3, 0).T)


def test_cifarfs_splits(manual_dir, tmp_path):
    arrays = load_split_arrays(CifarFs, data_dir=str(tmp_path), manual_dir=str(manual_dir))
    fine, coarse = cifar_names()
    for split, count in {"train": 64, "val": 16, "test": 20}.items():
        pairs = split_json(f"cifarfs_{split}.json")
        assert len(pairs) == count
        check(
            arrays[split].dense(),
            [fine.index(c) for _, c in pairs],
            [coarse.index(s) for s, _ in pairs],
        )
    source = CifarFs(data_dir=str(tmp_path)).as_data_source("val")
    assert source[0]["class_name"].decode() == "/".join(split_json("cifarfs_val.json")[0])


def test_fc100_splits_by_superclass(manual_dir, tmp_path):
    arrays = load_split_arrays(Fc100, data_dir=str(tmp_path), manual_dir=str(manual_dir))
    fine, coarse = cifar_names()
    coarse_of = {
        c: coarse.index(s)
        for split in ("train", "val", "test")
        for s, c in split_json(f"cifarfs_{split}.json")
    }
    for split, count in {"train": 60, "val": 20, "test": 20}.items():
        superclasses = [coarse.index(s) for s in split_json(f"fc100_superclasses_{split}.json")]
        fine_ids = [i for s in superclasses for i, c in enumerate(fine) if coarse_of[c] == s]
        assert len(fine_ids) == count
        check(arrays[split].dense(), fine_ids, [coarse_of[fine[i]] for i in fine_ids])


def test_task_distributions(manual_dir, tmp_path):
    for factory in (cifarfs, fc100):
        tasks = factory(ways=5, num_queries=2, data_dir=str(tmp_path), manual_dir=str(manual_dir))
        assert tasks.input_shape == (32, 32, 3) and tasks.kind == "classification"
        task = tasks.sample(tasks.splits["test"], jax.random.key(0), 1)
        assert task.support[0].shape == (5, 32, 32, 3) and task.query[0].shape == (10, 32, 32, 3)


def test_extracted_folder_layout(manual_dir, tmp_path):
    with tarfile.open(manual_dir / "cifar-100-python.tar.gz") as tar:
        tar.extractall(tmp_path / "manual", filter="data")
    arrays = load_split_arrays(
        CifarFs, data_dir=str(tmp_path / "tfds"), manual_dir=str(tmp_path / "manual")
    )
    assert arrays["train"].dense().shape == (64, 3, 32, 32, 3)


def test_online_path_downloads_the_python_archive(manual_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "resolve_host", lambda host: None)
    monkeypatch.setattr(
        tfds.download.DownloadManager,
        "download",
        lambda self, url: manual_dir / "cifar-100-python.tar.gz",
    )
    assert load_split_arrays(Fc100, data_dir=str(tmp_path))["val"].num_classes == 20


def test_truncated_archive(manual_dir, tmp_path):
    manual = tmp_path / "manual"
    manual.mkdir()
    (manual / "cifar-100-python.tar.gz").write_bytes(
        (manual_dir / "cifar-100-python.tar.gz").read_bytes()
    )
    truncate(str(manual / "cifar-100-python.tar.gz"), 0.6)
    with pytest.raises(DataSourceError) as err:
        cifarfs(data_dir=str(tmp_path), manual_dir=str(manual))
    message = str(err.value)
    assert "\n" not in message
    assert "cifar-100-python.tar.gz is truncated or corrupt" in message
    assert "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz" in message


def test_missing_archive_and_missing_class(tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "cifar-10-python.tar.gz").write_bytes(b"")
    with pytest.raises(DataSourceError, match=r"cifar-100-python.tar.gz not found; download"):
        fc100(data_dir=str(tmp_path), manual_dir=str(tmp_path / "other"))
    write_cifar(str(tmp_path / "renamed"), rename={"dolphin": "porpoise"})
    with pytest.raises(DataSourceError, match=r"class dolphin of the train split is not in"):
        cifarfs(data_dir=str(tmp_path), manual_dir=str(tmp_path / "renamed"))


def test_refuses_pickles_that_would_run_code(tmp_path):
    import io
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    data = pickle.dumps({"data": Evil()})
    (tmp_path / "manual").mkdir()
    with tarfile.open(tmp_path / "manual" / "cifar-100-python.tar.gz", "w:gz") as tar:
        for member in ("train", "test", "meta"):
            info = tarfile.TarInfo(f"cifar-100-python/{member}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(DataSourceError, match=r"refusing to load builtins.print"):
        cifarfs(data_dir=str(tmp_path), manual_dir=str(tmp_path / "manual"))
