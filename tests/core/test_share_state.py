"""The stored state of a shared group's lane: pure steps (acquire, settle, expire) and the entry's encoding."""

from __future__ import annotations

import pytest

from meteor_spark.errors import FormatError
from meteor_spark.format.offsets import first_offset_of, make_offset
from meteor_spark.groups.shared_state import ACQUIRED, AVAILABLE, DONE, LaneShare, Span


def test_fresh_acquisitions_then_acks_move_the_start_and_keep_the_entry_compact() -> None:
    share = LaneShare.initial(first_offset_of(0))
    share = share.acquire([], "t1", first_offset_of(2))  # items 0 and 1
    share = share.acquire([], "t2", make_offset(2, 3))  # three records of item 2
    assert share.spans == (
        Span(first_offset_of(0), first_offset_of(2), ACQUIRED, 1, "t1"),
        Span(first_offset_of(2), make_offset(2, 3), ACQUIRED, 1, "t2"),
    )
    share, refused = share.settle([(first_offset_of(2), make_offset(2, 3))], "t2", DONE)
    assert refused == [] and share.start == first_offset_of(0)  # t1 still holds the front
    assert share.spans[-1] == Span(first_offset_of(2), make_offset(2, 3), DONE)
    share, refused = share.settle([(first_offset_of(0), first_offset_of(2))], "t1", DONE)
    assert refused == [] and share.spans == () and share.start == share.next == make_offset(2, 3)
    assert LaneShare.decode(share.encode(), "x") == share


def test_only_the_holding_acquisition_settles_and_a_partial_ack_splits_a_span() -> None:
    share = LaneShare.initial(0).acquire([], "t1", make_offset(0, 10))
    share, refused = share.settle([(make_offset(0, 2), make_offset(0, 4))], "t2", DONE)
    assert refused == [(make_offset(0, 2), make_offset(0, 4))]
    share, refused = share.settle([(make_offset(0, 2), make_offset(0, 4))], "t1", DONE)
    assert refused == []
    assert [s.state for s in share.spans] == [ACQUIRED, DONE, ACQUIRED]
    share, refused = share.settle([(make_offset(0, 2), make_offset(0, 3))], "t1", DONE)  # already done
    assert refused == [(make_offset(0, 2), make_offset(0, 3))]


def test_released_and_timed_out_records_keep_their_delivery_count_and_are_acquired_again() -> None:
    share = LaneShare.initial(0).acquire([], "t1", make_offset(0, 6))
    share, _ = share.settle([(make_offset(0, 0), make_offset(0, 2))], "t1", AVAILABLE)  # nack two
    share = share.expire(["t1"])  # the rest timed out
    assert share.spans == (Span(0, make_offset(0, 6), AVAILABLE, 1),)  # merged: same state, same count
    share = share.acquire([(0, make_offset(0, 3), 2)], "t2")
    assert share.spans == (
        Span(0, make_offset(0, 3), ACQUIRED, 2, "t2"),
        Span(make_offset(0, 3), make_offset(0, 6), AVAILABLE, 1),
    )
    with pytest.raises(ValueError, match="not available"):
        share.acquire([(0, 1, 3)], "t3")
    assert share.tokens() == {"t2"} and share.available() == [share.spans[1]]


def test_a_malformed_or_newer_entry_is_a_format_error_naming_it() -> None:
    with pytest.raises(FormatError, match="newer than this version"):
        LaneShare.decode('{"next":0,"spans":[],"start":0,"v":99}', "k in map m")
    with pytest.raises(FormatError, match="k in map m"):
        LaneShare.decode('{"next":5,"spans":[],"start":0,"v":1}', "k in map m")  # spans leave a gap
    with pytest.raises(FormatError, match="k in map m"):
        LaneShare.decode('{"next":5,"spans":[[0,5,"x"]],"start":0,"v":1}', "k in map m")
