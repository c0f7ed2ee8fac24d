"""The shared few-shot TFDS builder on a generated source whose classes differ in size."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from metalearn.data.episodes import episode_distribution
from metalearn.data.fewshot_builder import SPLITS, FewShotBuilder, load_split_arrays
from metalearn.data.sources import DataSourceError
from tests.data.fake_sources import unequal_classes


class UnequalFewShot(FewShotBuilder, skip_registration=True):
    """A generated dataset, like tieredImageNet or CUB: classes of different sizes."""

    IMAGE_SHAPE = (6, 6, 1)
    EQUAL_CLASS_SIZES = False

    def _split_generators(self, dl_manager):
        classes = unequal_classes(self.IMAGE_SHAPE)
        return {
            split: self._generate_examples([(n, lambda i=i: i) for n, i in classes[split]])
            for split in SPLITS
        }


class EqualFewShot(UnequalFewShot, skip_registration=True):
    """The same source, read by a builder that knows every class has one size."""

    EQUAL_CLASS_SIZES = True


def test_reads_classes_of_different_sizes_back_in_order(tmp_path):
    arrays = load_split_arrays(UnequalFewShot, data_dir=str(tmp_path))
    for split, classes in unequal_classes().items():
        layout = arrays[split]
        assert layout.counts.tolist() == [len(images) for _, images in classes]
        assert layout.offsets.tolist() == np.cumsum([0] + layout.counts.tolist()[:-1]).tolist()
        assert layout.images.dtype == np.uint8 and layout.images.shape[1:] == (6, 6, 1)
        for c, (_, images) in enumerate(classes):
            np.testing.assert_array_equal(layout.class_images(c), images)
        smallest = int(np.argmin(layout.counts))
        assert layout.min_count == 3 and layout.smallest == classes[smallest][0]
    assert load_split_arrays(UnequalFewShot, data_dir=str(tmp_path))["val"].summary() == (
        "(3 classes, 3 to 7 images, 6, 6, 1)"  # prepared once, read again
    )


def test_episodes_from_the_read_split_stay_within_each_class(tmp_path):
    arrays = load_split_arrays(UnequalFewShot, data_dir=str(tmp_path))
    tasks = episode_distribution(arrays, ways=3, num_queries=1, dataset="unequal")
    sample = jax.jit(jax.vmap(lambda k: tasks.sample(tasks.splits["train"], k, 2)))
    (xs, ys), (xq, yq) = sample(jax.random.split(jax.random.key(0), 200))
    values = np.rint(np.concatenate([xs, xq], 1)[:, :, 0, 0, 0] * 255).astype(int)
    classes, examples = values // 16, values % 16
    sizes = np.array([5, 11, 3, 8, 6, 9])
    assert (examples < sizes[classes]).all()
    assert set(np.unique(examples[classes == 1])) == set(range(11))  # the largest: all drawn
    with pytest.raises(ValueError, match=r"data.num_queries=3 leaves no support examples: class "):
        episode_distribution(arrays, ways=3, num_queries=3, dataset="unequal")


def test_a_builder_with_equal_class_sizes_reports_the_odd_class(tmp_path):
    with pytest.raises(DataSourceError, match=r"class train_class1 has 11 images but the classes"):
        load_split_arrays(EqualFewShot, data_dir=str(tmp_path))
