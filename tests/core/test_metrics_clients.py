"""Prometheus metrics of publishers, subscribers and groups: scraped over HTTP like Prometheus does."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import prometheus_client
import pytest

from meteor_spark import metrics
from meteor_spark.consumer.shared_subscriber import SharedSubscriber
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import ConfigError, FencedError
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.groups.exclusive import GroupMember
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until
from tests.metrics_scrape import Scraped
from tests.metrics_scrape import scrape as scrape_url


@pytest.fixture
def registry() -> prometheus_client.CollectorRegistry:
    return prometheus_client.CollectorRegistry()


@pytest.fixture
def scrape(registry: prometheus_client.CollectorRegistry) -> Iterator[object]:
    """GET /metrics from a real HTTP endpoint on a free port; {(name, labels...): value}."""
    server, thread = metrics.start_http_server(0, addr="127.0.0.1", registry=registry)
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"

    def get() -> Scraped:
        return scrape_url(url)

    yield get
    server.shutdown()
    server.server_close()
    thread.join(10)


def series(scraped: dict, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in scraped, f"{name}{labels} not scraped; have {sorted(k for k in scraped if k[0] == name)}"
    return scraped[key]


def test_publisher_series_count_what_was_stored(grid, unique_name, registry, scrape) -> None:
    with Publisher(grid, StreamConfig(unique_name, lanes=2), metrics=registry) as pub:
        for number in range(25):
            pub.publish_async(f"r{number}".encode())
        pub.flush()
        scraped = scrape()
        assert series(scraped, "meteor_publisher_records_total", stream=unique_name) == 25
        assert series(scraped, "meteor_publisher_items_total", stream=unique_name) == pub.items_sent >= 2
        assert series(scraped, "meteor_publisher_requests_total", stream=unique_name) >= 1
        assert series(scraped, "meteor_publisher_failed_records_total", stream=unique_name) == 0
        assert series(scraped, "meteor_publisher_buffered_records", stream=unique_name) == 0
    # Closed: the counter keeps its value (counters never go down), the gauge of the closed publisher is gone.
    scraped = scrape()
    assert series(scraped, "meteor_publisher_records_total", stream=unique_name) == 25
    assert ("meteor_publisher_buffered_records", (("stream", unique_name),)) not in scraped
    with Publisher(grid, unique_name, metrics=registry) as pub:
        pub.publish(b"one more")
    assert series(scrape(), "meteor_publisher_records_total", stream=unique_name) == 26


def test_subscriber_series_and_lag_per_lane(grid, unique_name, registry, scrape) -> None:
    with Publisher(grid, StreamConfig(unique_name, lanes=1), linger_ms=0) as pub:
        for number in range(10):
            pub.publish(f"r{number}".encode())
    with Subscriber(grid, unique_name, initial_offset_scheme="earliest", metrics=registry) as sub:
        read = 0
        while read < 10:
            read += len(sub.poll(timeout_ms=1000))
        scraped = scrape()
        assert series(scraped, "meteor_subscriber_records_total", stream=unique_name, group="") == 10
        assert series(scraped, "meteor_subscriber_skipped_items_total", stream=unique_name, group="") == 0
        assert series(scraped, "meteor_subscriber_corrupt_items_total", stream=unique_name, group="") == 0
        assert series(scraped, "meteor_subscriber_lag_items", stream=unique_name, group="", lane="0") == 0
        with Publisher(grid, unique_name, linger_ms=0) as pub:
            pub.publish(b"a")
            pub.publish(b"b")  # one ring item each: publish waits for the first to be stored
        ring_items = grid.ring(open_stream(grid, unique_name).ring_names[0]).tail() + 1
        assert ring_items == 12
        assert series(scrape(), "meteor_subscriber_lag_items", stream=unique_name, group="", lane="0") == 2
        # Ungrouped: no group series.
        assert not any(name.startswith("meteor_group_") for name, _ in scrape())


def test_grouped_subscriber_reports_its_group(grid, unique_name, registry, scrape) -> None:
    with Publisher(grid, StreamConfig(unique_name, lanes=3)) as pub:
        for number in range(30):
            pub.publish_async(f"r{number}".encode())
    group = f"{unique_name}-g"
    with Subscriber(grid, unique_name, group=group, initial_offset_scheme="earliest", metrics=registry) as sub:
        wait_until(lambda: sub.metrics()["lanes_held"] == 3, timeout_s=20, message="the only member holds every lane")
        read = 0
        while read < 30:
            read += len(sub.poll(timeout_ms=1000))
        sub.confirm()
        scraped = scrape()
        labels = {"stream": unique_name, "group": group}
        assert series(scraped, "meteor_subscriber_records_total", **labels) == 30
        assert series(scraped, "meteor_group_lease_acquisitions_total", **labels) == 3
        assert series(scraped, "meteor_group_lease_losses_total", **labels) == 0
        assert series(scraped, "meteor_group_fencing_refusals_total", **labels) == 0
        assert series(scraped, "meteor_group_lanes_held", **labels) == 3
        for lane in range(3):
            assert series(scraped, "meteor_subscriber_lag_items", lane=str(lane), **labels) == 0
    # After close the counters stay; the gauges of the closed member are gone.
    scraped = scrape()
    assert series(scraped, "meteor_group_lease_acquisitions_total", stream=unique_name, group=group) == 3
    assert ("meteor_group_lanes_held", (("group", group), ("stream", unique_name))) not in scraped


def test_shared_member_reports_what_it_settled(grid, unique_name, registry, scrape) -> None:
    with Publisher(grid, StreamConfig(unique_name, lanes=2)) as pub:
        for number in range(10):
            pub.publish_async(f"r{number}".encode())
    group = f"{unique_name}-shared"
    labels = {"stream": unique_name, "group": group}
    dead = f"{unique_name}-dead"
    with Subscriber(
        grid,
        unique_name,
        shared=True,
        group=group,
        initial_offset_scheme="earliest",
        dead_letter_stream=dead,
        metrics=registry,
    ) as member:
        assert isinstance(member, SharedSubscriber)
        held: list = []
        wait_until(
            lambda: held.extend(member.poll(timeout_ms=200)) or len(held) >= 10,
            timeout_s=20,
            message="the shared member is handed every record",
        )
        member.ack(held[:5])
        member.nack(held[5:7])
        member.reject(held[7:8])
        member.renew(held[8:10])
        scraped = scrape()
        assert series(scraped, "meteor_subscriber_records_total", **labels) == 10
        assert series(scraped, "meteor_shared_acked_records_total", **labels) == 5
        assert series(scraped, "meteor_shared_released_records_total", **labels) == 2
        assert series(scraped, "meteor_shared_rejected_records_total", **labels) == 1
        assert series(scraped, "meteor_shared_dead_lettered_records_total", **labels) == member.dead_lettered_records
        assert series(scraped, "meteor_shared_renewed_records_total", **labels) == 2
        assert series(scraped, "meteor_shared_refused_records_total", **labels) == 0
        assert series(scraped, "meteor_subscriber_corrupt_items_total", **labels) == 0
        assert series(scraped, "meteor_shared_held_records", **labels) == 2
    # Closing releases the two it still held: counted, kept after close; the gauge of the closed member is gone.
    scraped = scrape()
    assert series(scraped, "meteor_shared_acked_records_total", **labels) == 5
    assert series(scraped, "meteor_subscriber_records_total", **labels) == 10
    assert ("meteor_shared_held_records", (("group", group), ("stream", unique_name))) not in scraped


def test_shared_member_metrics_must_be_a_registry(grid, unique_name) -> None:
    with pytest.raises(ConfigError, match="CollectorRegistry"):
        Subscriber(grid, StreamConfig(unique_name), shared=True, group="g", metrics="yes")


def test_group_member_counts_fencing_refusals(grid, unique_name) -> None:
    info = open_stream(grid, StreamConfig(unique_name, lanes=1))
    with GroupMember(grid, info, "g", lease_ms=2000) as member:
        epoch = member.assignment()[0]
        member.confirm(0, 5, epoch=epoch)
        with pytest.raises(FencedError):
            member.confirm(0, 6, epoch=epoch + 1)  # records read under another epoch are never confirmed
        assert member.metrics() == {
            "lease_acquisitions": 1,
            "lease_losses": 0,
            "fencing_refusals": 1,
            "lanes_held": 1,
        }


def test_metrics_true_uses_the_default_registry(grid, unique_name) -> None:
    with Publisher(grid, StreamConfig(unique_name), metrics=True) as pub:
        pub.publish(b"x")
        value = prometheus_client.REGISTRY.get_sample_value("meteor_publisher_records_total", {"stream": unique_name})
        assert value == 1


def test_metrics_must_be_a_registry(grid, unique_name) -> None:
    with pytest.raises(ConfigError, match="CollectorRegistry"):
        Publisher(grid, StreamConfig(unique_name), metrics="yes")


def test_importing_meteor_spark_does_not_import_prometheus_client() -> None:
    code = (
        "import sys, meteor_spark, meteor_spark.producer.publisher, meteor_spark.consumer.subscriber, "
        "meteor_spark.metrics; print('prometheus_client' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_missing_prometheus_client_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import now raises ImportError
    with pytest.raises(ConfigError, match=r"meteor-spark\[metrics\]"):
        metrics.require_prometheus()
