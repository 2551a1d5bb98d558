"""Counting records without reading them: ``count_records`` reads item headers, ``tally_records`` decodes."""

from __future__ import annotations

from meteor_spark.format.records import encode_batch
from meteor_spark.grid.client import Grid
from meteor_spark.grid.reading import count_records, tally_records
from meteor_spark.grid.streams import StreamConfig, open_stream


def test_count_records_reads_headers_only_and_tally_records_checks_bodies(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name))
    ring = grid.ring(info.ring_names[0])
    good = encode_batch([b"a", b"b", b"c"], producer_id=1, producer_seq=0)
    body_corrupt = encode_batch([b"d", b"e"], producer_id=1, producer_seq=1)
    body_corrupt = body_corrupt[:-1] + bytes([body_corrupt[-1] ^ 0xFF])
    for item in (good, body_corrupt, b"not a meteor batch", good):
        ring.add(item)
    # The header of item 1 is sound, so its 2 records count; item 2 has no meteor header and counts as 0.
    assert count_records(grid, info, 0, 0, 4) == 8
    tally = tally_records(grid, info, 0, 0, 4)
    assert (tally.records, tally.corrupt_sequences) == (6, (1, 2))
