"""The redrive progress entry: done ranges rebuilt over the letters a lane holds (bounded, never losing a letter
done), the step in progress, and the canonical encoding compare-and-set needs."""

from __future__ import annotations

import pytest

from meteor_spark.consumer.redrive_state import RedriveProgress, RedriveRun, message_id_of, runs_of
from meteor_spark.errors import FormatError


def test_runs_cover_consecutive_held_letters_across_item_boundaries() -> None:
    held = [0, 1, 65536, 65537, 131072]
    assert runs_of(held, [True, True, True, False, True]) == ((0, 65536), (131072, 131072))
    assert runs_of(held, [False] * 5) == ()


def test_marking_joins_ranges_and_drops_letters_no_longer_held() -> None:
    progress = RedriveProgress().marked([(0, 0), (0, 65536)], {0: [0, 1, 65536]})
    assert progress.done[0] == ((0, 0), (65536, 65536))
    assert not progress.is_done(0, 1) and progress.is_done(0, 65536)
    joined = progress.marked([(0, 1)], {0: [0, 1, 65536, 65537]})
    assert joined.done[0] == ((0, 65536),) and joined.is_done(0, 1) and not joined.is_done(0, 65537)
    # letter 0 was overwritten: the ranges keep only what the lane holds
    assert joined.marked([], {0: [1, 65536, 65537]}).done[0] == ((1, 65536),)
    # a lane not scanned keeps its ranges
    assert joined.marked([(1, 5)], {1: [5]}).done == {0: ((0, 65536),), 1: ((5, 5),)}


def test_the_entry_round_trips_canonically_with_its_step() -> None:
    run = RedriveRun("h-1-ab", "h", 1, ((0, 3), (1, 65536)), {"orders": {0: 7, 1: 9}})
    progress = RedriveProgress({0: ((0, 2),)}, run)
    text = progress.encode()
    again = RedriveProgress.decode(text, "x")
    assert again == progress and again.encode() == text
    assert RedriveProgress.decode(again.with_run(None).encode(), "x").run is None
    assert message_id_of("dlq-s:0:3") == "dlq:dlq-s:0:3"
    with pytest.raises(FormatError, match="redrive progress"):
        RedriveProgress.decode('{"v": 99, "done": {}}', "'orders-dlq' in map 'meteor.dlq.redrive'")
