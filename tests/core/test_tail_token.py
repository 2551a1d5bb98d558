"""The tail token of ``publish_async``'s append (``meteor_spark.producer.tail_token``): a publishing thread never
waits for it (its value takes the counted way), a step under the accumulator's lock waits until it is given back."""

from __future__ import annotations

import threading
from typing import cast

from meteor_spark.producer.accumulator import Accumulator
from meteor_spark.producer.batching import PublisherSettings
from meteor_spark.producer.calls import Call, Segment
from meteor_spark.producer.futures import RecordFuture
from meteor_spark.producer.tail_token import TailToken
from meteor_spark.testing import wait_until


def _general(record: object, callback: object = None, **routing: object) -> RecordFuture:
    raise AssertionError(f"{record!r} left the plain path")


def test_a_step_waits_for_the_token_a_publishing_thread_holds_until_it_is_given_back() -> None:
    token = TailToken()
    held = token.tokens.pop()  # a publishing thread's append holds it
    got: list[bool] = []
    step = threading.Thread(target=lambda: got.append(token.take()))
    step.start()
    wait_until(lambda: token.waiters == 1, timeout_s=10)  # counted in: it waits
    assert not got and step.is_alive()
    token.tokens.append(held)  # given back the way plain_publisher's append does it
    token.given_back()
    step.join(10)
    assert got == [True] and token.waiters == 0 and not token.tokens
    token.give(True)
    assert list(token.tokens) == [True] and token.take() is True


def test_a_value_whose_append_finds_the_token_held_takes_the_counted_way_in_order() -> None:
    acc = Accumulator("s", 1, PublisherSettings(), 64)
    publish = acc.plain_publisher(100, bool, _general)
    sent: list[Call] = []
    acc.send_now = sent.append
    first = publish(b"a")  # an idle lane: claimed and sent by the caller
    second = publish(b"b")  # the lane in flight: counted, and the tail opens
    third = publish(b"c")  # appended to the tail, uncounted
    held = acc.tail_token.tokens.pop()  # another publishing thread's append holds the token

    def give_back_once_waited_for() -> None:
        wait_until(lambda: acc.tail_token.waiters == 1, timeout_s=10)
        acc.tail_token.tokens.append(held)
        acc.tail_token.given_back()

    giver = threading.Thread(target=give_back_once_waited_for)
    giver.start()
    fourth = publish(b"d")  # not appended to the tail: the counted way, whose fold waits for the token
    giver.join(10)
    assert not giver.is_alive()
    assert second._segment is third._segment is fourth._segment
    assert cast(Segment, second._segment).values == [b"b", b"c", b"d"]
    assert [f._index for f in (second, third, fourth)] == [0, 1, 2]
    assert acc.outstanding_records() == 4 and [call.n_records for call in sent] == [1] and first._index == 0
    assert list(acc.tail_token.tokens) == [True] and acc.tail_token.waiters == 0
    fifth = publish(b"e")  # the tail again
    assert fifth._segment is second._segment and fifth._index == 3 and acc.outstanding_records() == 5
