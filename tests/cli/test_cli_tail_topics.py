"""``meteor tail --topics``: a topic filter on a persistent stream, a consuming entity on an ephemeral one."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.grid.subscriptions import NOT_STORED, live_subscriptions
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until

Meteor = Callable[..., Any]


def test_topics_filter_a_persistent_stream_and_json_shows_the_topic(
    meteor: Meteor, grid: Grid, unique_name: str
) -> None:
    with Publisher(grid, StreamConfig(unique_name)) as publisher:
        publisher.publish_many([Record(b"1", topic="a.x"), Record(b"2", topic="b"), Record(b"3", topic="a.y.z")])
    run = meteor(
        "tail", unique_name, "--from", "earliest", "--topics", "a.*", "--topics", "a.*.z", "--json", "--max", "2"
    )
    assert run.code == 0, run
    documents = [json.loads(line) for line in run.out.splitlines()]
    assert [(d["value"], d["topic"]) for d in documents] == [("1", "a.x"), ("3", "a.y.z")]
    pretty = meteor("tail", unique_name, "--from", "earliest", "--topics", "b", "--max", "1")
    assert " topic=b  2" in pretty.out


def test_tail_on_an_ephemeral_stream_is_an_entity_with_its_patterns(
    meteor: Meteor, grid: Grid, unique_name: str
) -> None:
    Publisher(grid, StreamConfig(unique_name, ephemeral=True)).close()
    offsets: list[int] = []

    def publish_once_registered() -> None:
        wait_until(lambda: live_subscriptions(grid, unique_name), 20, message="tail registered")
        with Publisher(grid, unique_name) as publisher:
            offsets.append(publisher.publish(b"kept", topic="orders.eu.created"))
            offsets.append(publisher.publish(b"dropped", topic="audit.login"))

    publisher_thread = threading.Thread(target=publish_once_registered)
    publisher_thread.start()
    try:
        run = meteor("tail", unique_name, "--topics", "orders.#", "--json", "--max", "1", "--timeout", "20")
    finally:
        publisher_thread.join()
    assert run.code == 0, run
    assert [json.loads(line)["value"] for line in run.out.splitlines()] == ["kept"]
    assert offsets[0] >= 0 and offsets[1] == NOT_STORED
    assert live_subscriptions(grid, unique_name) == []  # tail left the registry when it stopped


def test_bad_topics_and_going_back_on_an_ephemeral_stream_are_user_errors(
    meteor: Meteor, grid: Grid, unique_name: str
) -> None:
    Publisher(grid, StreamConfig(unique_name, ephemeral=True)).close()
    meteor("tail", unique_name, "--from", "earliest", "--max", "1").assert_user_error("--from", "ephemeral")
    meteor("tail", unique_name, "--since", "10m", "--max", "1").assert_user_error("--since", "ephemeral")
    meteor("tail", unique_name, "--topics", "ord*rs", "--max", "1").assert_user_error("'ord*rs'")
