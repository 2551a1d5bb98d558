"""Decoding ring items with pyarrow's LZ4 codec (the Spark path) gives what ``lz4.block`` gives, and every fault a
faster decompressor could hide (a short body, a refused block, a negative length under a valid checksum) is still
a ``FormatError`` naming the item."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from typing import Any

import lz4.block
import numpy as np
import pytest

from meteor_spark.errors import FormatError
from meteor_spark.format.arrow_columns import ARROW_LZ4, items_to_arrow
from meteor_spark.format.item_encoding import ItemFraming, encode_items, prepare_columns
from meteor_spark.format.item_header import FLAG_LZ4, HEADER, HEADER_SIZE, MAGIC
from meteor_spark.format.wire import ItemView, decode_item


def _items() -> list[bytes]:
    """Real items of every column kind, compressed: keys (some missing), headers, per-record timestamps."""
    values = [str(i).rjust(90 + i % 20, "v").encode() for i in range(700)]
    keys = [None if i % 5 == 0 else b"k%d" % (i % 9) for i in range(700)]
    headers = [(("h", b"x" * (i % 3)),) if i % 2 else () for i in range(700)]
    stamps = [1_700_000_000_000 + 3 * i for i in range(700)]
    pieces = [
        [prepare_columns(values, timestamps=1_700_000_000_000)],
        [prepare_columns(values, keys=keys, headers=headers, timestamps=stamps)],
    ]
    items = encode_items(pieces, ItemFraming(7, 0))
    assert all(item[5] & FLAG_LZ4 for item in items)
    return items


def _fields(view: ItemView) -> list[Any]:
    return [bytes(x) if isinstance(x, memoryview) else x for x in vars(view).values()]


def test_pyarrows_lz4_codec_reads_exactly_what_lz4_block_reads() -> None:
    assert ARROW_LZ4 is not None
    for seq, item in enumerate(_items()):
        fast = decode_item(item, stream="s", lane=0, sequence=seq, decompress=ARROW_LZ4)
        slow = decode_item(item, stream="s", lane=0, sequence=seq)
        assert vars(fast) == vars(ItemView(**vars(fast)))  # decoding builds what the dataclass's __init__ builds
        for a, b in zip(_fields(fast), _fields(slow), strict=True):
            if isinstance(a, np.ndarray):
                assert np.array_equal(a, b)
            else:
                assert a == b


def _lz4_item(body: bytes, *, announced: int | None = None) -> bytes:
    """A version 2 item of one value whose LZ4 body is ``body`` compressed, announcing ``announced`` body bytes."""
    stored = lz4.block.compress(body, store_size=False)
    size = len(body) if announced is None else announced
    prefix = HEADER.pack(MAGIC, 2, FLAG_LZ4, 0, 1, 0, 0, 0, 0, size, len(stored), 0)[: HEADER_SIZE - 4]
    return prefix + struct.pack("<I", zlib.crc32(stored, zlib.crc32(prefix))) + stored


def _one_value_body(value: bytes) -> bytes:
    return struct.pack("<i", len(value)) + value


@pytest.mark.parametrize(
    "decompress",
    [
        pytest.param(lambda stored, size: bytes(size), id="returns-garbage"),
        pytest.param(lambda stored, size: b"", id="returns-short"),
        pytest.param(lambda stored, size: 1 / 0, id="raises"),
    ],
)
def test_a_decompressor_that_errs_is_overruled_by_lz4_block(decompress: Callable[[Any, int], Any]) -> None:
    value = b"abcdefgh" * 300
    view = decode_item(_lz4_item(_one_value_body(value)), stream="s", lane=0, sequence=0, decompress=decompress)
    assert bytes(view.value_data) == value


def test_a_body_shorter_than_announced_is_refused_with_the_arrow_codec() -> None:
    # The codec returns as many bytes as asked for (the rest uninitialised): the check must not let that through.
    # Memory left over from an earlier decompression of this 8-byte pattern can end in the block's last literals, and
    # the body then passes that check: the column walk refuses the bytes past the last column instead. Either way the
    # item is refused, naming where it is.
    body = _one_value_body(b"abcdefgh" * 300)
    item = _lz4_item(body, announced=len(body) + 64)
    refused = "stream 's' lane 3 sequence 9: (the LZ4 body|64 unexpected bytes after the last column)"
    with pytest.raises(FormatError, match=refused):
        decode_item(item, stream="s", lane=3, sequence=9, decompress=ARROW_LZ4)


def test_a_corrupt_block_is_refused_with_the_arrow_codec() -> None:
    item = bytearray(_lz4_item(_one_value_body(b"abcdefgh" * 300)))
    item[HEADER_SIZE] = 0xFF  # a token announcing literals past the block's end
    crc = zlib.crc32(bytes(item[HEADER_SIZE:]), zlib.crc32(bytes(item[: HEADER_SIZE - 4])))
    struct.pack_into("<I", item, HEADER_SIZE - 4, crc)
    with pytest.raises(FormatError, match="does not decompress"):
        decode_item(bytes(item), stream="s", lane=0, sequence=0, decompress=ARROW_LZ4)


@pytest.mark.parametrize("count", [1, 3])
def test_a_negative_value_length_under_a_valid_checksum_is_named(count: int) -> None:
    lengths = [2] * count
    lengths[-1] = -2
    body = struct.pack(f"<{count}i", *lengths) + b"ab" * count
    prefix = HEADER.pack(MAGIC, 2, 0, 0, count, 0, 0, 0, 0, len(body), len(body), 0)[: HEADER_SIZE - 4]
    item = prefix + struct.pack("<I", zlib.crc32(body, zlib.crc32(prefix))) + body
    with pytest.raises(FormatError, match="negative value length"):
        decode_item(item, stream="s", lane=0, sequence=0)


def test_the_spark_path_decodes_with_the_arrow_codec() -> None:
    items = _items()
    batch = items_to_arrow(items, [0, 1], stream="s", lane=0, include_headers=True)
    assert batch.num_rows == 1400
    assert batch.column("value")[699].as_py() == str(699).rjust(90 + 699 % 20, "v").encode()
