"""The embedded member's Prometheus endpoint (``EmbeddedGrid(metrics_port=...)``, ``meteor grid start
--metrics-port``): scraped over HTTP while a real client works against the member."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.producer.publisher import Publisher
from meteor_spark.server import EmbeddedGrid
from meteor_spark.server.member import READY_LINE
from meteor_spark.testing import wait_until
from tests.metrics_scrape import Scraped
from tests.metrics_scrape import scrape as scrape_url

pytestmark = pytest.mark.embedded_only


def scrape(address: str) -> Scraped:
    return scrape_url(f"http://{address}/metrics")


def value(scraped: dict, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in scraped, f"{name}{labels} not scraped; have {sorted(k for k in scraped if k[0] == name)}"
    return scraped[key]


@pytest.mark.parametrize("process", [False, True], ids=["thread", "process"])
def test_member_figures_over_http(tmp_path, process: bool) -> None:
    with EmbeddedGrid(port=0, metrics_port=0, process=process, data_dir=tmp_path, fsync="always") as member:
        assert member.metrics_address is not None
        address = member.metrics_address
        empty = scrape(member.metrics_address)
        assert value(empty, "meteor_member_connections") == 0
        assert value(empty, "meteor_member_authenticated_clients") == 0
        with Grid(GridSettings(members=(member.address,), cluster_name=member.cluster_name)) as grid:
            with Publisher(grid, StreamConfig("orders", lanes=1), linger_ms=0) as pub:
                pub.publish(b"x" * 100)
                pub.publish(b"y" * 100)
            grid.map("m").set("k", "v")
            scraped = scrape(member.metrics_address)
            assert value(scraped, "meteor_member_connections") >= 1
            assert value(scraped, "meteor_member_authenticated_clients") >= 1
            ring = "meteor.stream::orders.0"
            assert value(scraped, "meteor_member_ring_items", ring=ring) == 2
            assert value(scraped, "meteor_member_ring_bytes", ring=ring) > 200  # two items of > 100 bytes each
            assert value(scraped, "meteor_member_map_entries", map="m") == 1
            assert value(scraped, "meteor_member_requests_total", type="Ringbuffer.addAll") == 2
            assert value(scraped, "meteor_member_requests_total", type="Map.set") >= 1
            assert value(scraped, "meteor_member_requests_total", type="Client.authentication") >= 1
            assert value(scraped, "meteor_member_fsyncs_total") >= 2  # fsync=always: one per acknowledged write
            assert value(scraped, "meteor_member_quarantined_ranges") == 0
        wait_until(
            lambda: value(scrape(address), "meteor_member_connections") == 0,
            message="the closed client's connection leaves the figures",
        )


def test_no_metrics_port_no_endpoint() -> None:
    with EmbeddedGrid(port=0) as member:
        assert member.metrics_address is None


def test_metrics_port_in_use_is_a_clear_error(tmp_path) -> None:
    with EmbeddedGrid(port=0, metrics_port=0) as first:
        assert first.metrics_address is not None
        taken = first.metrics_address.rsplit(":", 1)[1]
        result = subprocess.run(
            [sys.executable, "-m", "meteor_spark.server", "--port", "0", "--metrics-port", taken],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert f"cannot serve metrics on 127.0.0.1:{taken}" in result.stderr
    assert "--metrics-port" in result.stderr


def test_meteor_grid_start_metrics_port_from_the_config_file(tmp_path) -> None:
    """`meteor grid start` with `metrics-port` in the [server] table prints the endpoint on its ready line."""
    meteor = Path(sys.executable).with_name("meteor")
    if not meteor.exists():
        pytest.skip("the meteor console script is not installed next to this interpreter")
    config = tmp_path / "meteor.toml"
    config.write_text("[server]\nmetrics-port = 0\n")
    process = subprocess.Popen(
        [str(meteor), "grid", "start", "--port", "0", "--log-level", "WARNING", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        ready = READY_LINE.match(process.stdout.readline().strip())
        assert ready is not None and ready["metrics"], process.stderr.read() if process.poll() is not None else ""
        scraped = scrape(ready["metrics"])
        assert value(scraped, "meteor_member_connections") == 0
        assert value(scraped, "meteor_member_fsyncs_total") == 0  # no --data-dir: nothing to fsync
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
