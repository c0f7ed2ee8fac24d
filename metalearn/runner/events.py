"""TensorBoard event files of scalars, written directly: TFRecord framing around the three
protobuf messages a scalar needs (Event, Summary, Summary.Value). A run's curves then cost no
import of tensorboardX, which imports torch whenever torch is installed (1.5 s of every run's
start). The bytes equal tensorboardX's for the same events (tests/runner/test_events.py).

>>> import os, tempfile
>>> events = EventFile(os.path.join(tempfile.mkdtemp(), "events"), suffix=".run")
>>> events.add_scalar("train/loss", step=10, value=0.25)
>>> events.close()
>>> os.path.basename(events.path).startswith("events.out.tfevents.")
True
"""

from __future__ import annotations

import os
import re
import socket
import struct
import time


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    return table


_CRC32C_TABLE = _crc32c_table()
_INVALID_TAG_CHARACTERS = re.compile(r"[^-/\w.]")


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum of TFRecord framing.

    >>> hex(crc32c(b"123456789"))  # the standard check value
    '0xe3069283'
    """
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> bytes:
    crc = crc32c(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def _varint(number: int) -> bytes:
    number &= (1 << 64) - 1  # an int64 below zero is its two's complement
    out = bytearray()
    while number > 0x7F:
        out.append(number & 0x7F | 0x80)
        number >>= 7
    return bytes(out) + bytes([number])


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _float32(value: float) -> bytes:
    try:
        return struct.pack("<f", value)
    except OverflowError:  # beyond float32's range: infinity, as protobuf stores it
        return struct.pack("<f", float("inf") if value > 0 else float("-inf"))


def _event(wall_time: float, step: int, body: bytes) -> bytes:
    """An ``Event`` (proto3: a field at its default is not written)."""
    out = (b"\x09" + struct.pack("<d", wall_time)) if wall_time else b""  # 1: double wall_time
    out += (b"\x10" + _varint(step)) if step else b""  # 2: int64 step
    return out + body


class EventFile:
    """One event file, named as TensorBoard expects; every ``add_scalar`` is written through."""

    def __init__(self, prefix: str, suffix: str = ""):
        self.path = f"{prefix}.out.tfevents.{str(time.time())[:10]}.{socket.gethostname()}{suffix}"
        self._file = open(self.path, "wb")  # noqa: SIM115  (closed in close())
        self._write(_event(time.time(), 0, _length_delimited(3, b"brain.Event:2")))

    def add_scalar(self, tag: str, step: int, value: float, wall_time: float | None = None):
        """Append a scalar under ``tag`` (characters TensorBoard refuses become ``_``)."""
        tag = _INVALID_TAG_CHARACTERS.sub("_", tag).lstrip("/")
        value_message = _length_delimited(1, tag.encode()) + b"\x15" + _float32(float(value))
        summary = _length_delimited(1, value_message)  # Summary.value, repeated
        wall_time = time.time() if wall_time is None else wall_time
        self._write(_event(wall_time, step, _length_delimited(5, summary)))

    def _write(self, record: bytes) -> None:
        header = struct.pack("<Q", len(record))
        self._file.write(header + _masked_crc(header) + record + _masked_crc(record))

    def flush(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self.flush()
        self._file.close()
