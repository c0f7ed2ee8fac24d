"""metalearn's event files against tensorboardX, the reference: the same events give the same
bytes, and its protobuf decoder and CRC read ours back."""

import re
import struct
from pathlib import Path

import numpy as np
import pytest
from tensorboardX.proto.event_pb2 import Event
from tensorboardX.record_writer import RecordWriter, masked_crc32c
from tensorboardX.summary import scalar

from metalearn.runner.events import EventFile

TAGS = ["train/mse", "val/accuracy/shots1_steps5", "/leading/slash", "a b:c(d)", "ünï-côdé.x"]
VALUES = [0.0, -0.0, 1.5, -2.25e-3, float("nan"), float("inf"), float("-inf"), 1e39, -1e39,
          1e-50, 3.4028235e38, True, 7, 10**20]  # fmt: skip
STEPS = [0, 1, 300, 2**40]


def records(data: bytes) -> list[bytes]:
    """The payloads of a TFRecord file, each frame's two CRCs checked with tensorboardX's."""
    found, at = [], 0
    while at < len(data):
        header = data[at : at + 8]
        (length,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", data[at + 8 : at + 12])[0] == masked_crc32c(header)
        payload = data[at + 12 : at + 12 + length]
        assert struct.unpack("<I", data[at + 12 + length : at + 16 + length])[0] == (
            masked_crc32c(payload)
        )
        found.append(payload)
        at += 16 + length
    return found


def written(tmp_path) -> tuple[EventFile, list[tuple[str, int, float, float]]]:
    events = EventFile(str(tmp_path / "events"), suffix=".ours")
    added = []
    for n, (tag, value, step) in enumerate(
        (tag, value, step) for tag in TAGS for value in VALUES for step in STEPS
    ):
        wall_time = 1.7e9 + n / 8
        events.add_scalar(tag, step=step, value=value, wall_time=wall_time)
        added.append((tag, step, value, wall_time))
    events.close()
    return events, added


def test_the_bytes_are_tensorboardx_s_for_the_same_events(tmp_path):
    events, added = written(tmp_path)
    ours = Path(events.path).read_bytes()
    reference_path = tmp_path / "reference"
    reference = RecordWriter(str(reference_path))
    first = Event.FromString(records(ours)[0])  # the file-version event, its wall time ours
    assert first.file_version == "brain.Event:2" and first.wall_time > 1.7e9
    version = Event(wall_time=first.wall_time, file_version="brain.Event:2")
    reference.write(version.SerializeToString())
    for tag, step, value, wall_time in added:
        event = Event(wall_time=wall_time, step=step, summary=scalar(tag, float(value)))
        reference.write(event.SerializeToString())
    reference.close()
    assert ours == reference_path.read_bytes()


def test_tensorboardx_reads_back_every_scalar(tmp_path):
    events, added = written(tmp_path)
    read = [Event.FromString(r) for r in records(Path(events.path).read_bytes())[1:]]
    assert len(read) == len(added)
    for event, (tag, step, value, wall_time) in zip(read, added, strict=True):
        [entry] = event.summary.value
        assert (event.step, event.wall_time) == (step, wall_time)
        assert entry.tag == re.sub(r"[ :()]", "_", tag).lstrip("/")
        expected = np.float32(value) if abs(float(value)) < 3.5e38 else np.sign(value) * np.inf
        np.testing.assert_array_equal(np.float32(entry.simple_value), expected)


@pytest.mark.parametrize("data", [b"", b"a", b"123456789", bytes(range(256)) * 3])
def test_crc32c_is_tensorboardx_s(data):
    from tensorboardX.crc32c import crc32c as reference

    from metalearn.runner.events import crc32c

    assert crc32c(data) == reference(data)
