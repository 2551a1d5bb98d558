"""``meteor console`` in a real headless browser against the grid under test: every page loads without a script
error, the lag chart moves while a group falls behind, the tail shows records published after the page opened,
redrive is refused read-only (403) and runs with --allow-actions, and a token console refuses requests without
it (401). Screenshots are kept as artefacts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig, lane_bounds, open_stream
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until

pytestmark = pytest.mark.browser


@dataclass
class ConsoleProcess:
    """A running ``meteor console``: its base URL and the lines it printed at start."""

    url: str
    lines: list[str]
    process: subprocess.Popen[str]


@contextmanager
def console_process(settings: GridSettings, *flags: str, env: dict[str, str] | None = None) -> Iterator[ConsoleProcess]:
    """Start ``meteor console --port 0`` with ``flags``; the start line names the URL. Stopped by PID."""
    command = [
        sys.executable,
        "-m",
        "meteor_spark.cli",
        "console",
        "--port",
        "0",
        "--sample-interval",
        "0.5",
        "--members",
        ",".join(settings.members),
        "--cluster-name",
        settings.cluster_name,
        *flags,
    ]
    environment = {**os.environ, **(env or {})}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)
    try:
        assert process.stdout is not None
        first = process.stdout.readline()  # blocks until the console printed its address (or died)
        if "serving http://" not in first:
            process.kill()
            _, error = process.communicate(timeout=10)
            raise AssertionError(f"meteor console did not start: {first!r} {error!r}")
        lines = [first.strip()]
        url = first.split("serving ", 1)[1].split(" ", 1)[0]
        yield ConsoleProcess(url, lines, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def keep_shot(driver: Any, folder: Path, name: str) -> Path:
    """Save a screenshot of the page as ``name``.png (its path printed)."""
    target = folder / f"{name}.png"
    assert driver.save_screenshot(str(target)), target
    print(f"screenshot: {target}")
    return target


def severe_logs(driver: Any) -> list[dict[str, Any]]:
    """The browser console's errors since the last call (the log is drained by reading it)."""
    return [entry for entry in driver.get_log("browser") if entry.get("level") == "SEVERE"]


def http(url: str, *, method: str = "GET", headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """Status and JSON body (or text) of one request, errors included."""
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode("utf-8", "replace")


def load(driver: Any, url: str, ready: str) -> None:
    """Open ``url`` and wait until the script filled in what ``ready`` (a CSS selector) finds."""
    from selenium.webdriver.common.by import By

    driver.get(url)
    wait_until(lambda: driver.find_elements(By.CSS_SELECTOR, ready), 20, 0.1, message=f"{ready} on {url}")


@pytest.fixture(scope="module")
def console(grid_settings: GridSettings) -> Iterator[ConsoleProcess]:
    """A read-only console shared by the module's tests."""
    with console_process(grid_settings) as running:
        yield running


def publish(grid: Grid, stream: str, values: list[str], *, key: str | None = None, lanes: int = 1) -> None:
    with Publisher(grid, StreamConfig(stream, lanes=lanes)) as publisher:
        publisher.publish_many(
            [Record(v.encode(), key=None if key is None else key.encode(), topic="orders.created") for v in values]
        ).result()


def test_every_page_loads_without_a_script_error(
    browser: Any, console: ConsoleProcess, grid: Grid, unique_name: str, artefacts: Path
) -> None:
    from meteor_spark.consumer.shared_subscriber import SharedSubscriber
    from meteor_spark.grid.transactions import abort, begin

    stream = unique_name
    txn = f"{stream}-txn"
    publish(grid, stream, [f"v{n}" for n in range(10)], lanes=2)
    begin(grid, txn, 4_242_424, 60_000, stream=stream)  # an open transaction for the transactions page
    try:
        with (
            Subscriber(grid, stream, group="billing", initial_offset_scheme="earliest") as reader,
            SharedSubscriber(grid, stream, group="workers", initial_offset_scheme="earliest") as worker,
        ):
            wait_until(lambda: reader.poll(100), 20, message="a first batch")
            reader.confirm()
            taken = wait_until(lambda: worker.poll(100), 20, message="a shared batch")
            worker.ack(taken)
            severe_logs(browser)  # drain
            load(browser, console.url, f'#streams a[href="/streams/{stream}"]')
            keep_shot(browser, artefacts, "streams")
            load(browser, console.url + "groups", f'#groups a[href="/groups/{stream}/workers"]')
            load(browser, console.url + "groups", f'#groups a[href="/groups/{stream}/billing"]')
            load(browser, f"{console.url}groups/{stream}/billing", "#lanes table")
            load(browser, f"{console.url}groups/{stream}/workers", "#lanes table")
            assert "shared group of stream" in browser.page_source
            load(browser, f"{console.url}streams/{stream}", "#tail tr")
            load(browser, console.url + "dlq", "main table")
            load(browser, f"{console.url}dlq/{stream}", "main table")
            load(browser, console.url + "txns", "main table")
            assert txn in browser.page_source and stream in browser.page_source
            keep_shot(browser, artefacts, "transactions")
    finally:
        abort(grid, txn, "the test is over")
    errors = severe_logs(browser)
    assert errors == [], errors
    status, body = http(console.url + "api/tail/no-such-stream")
    assert status == 404 and "does not exist" in body["error"], body


def test_the_lag_chart_moves_while_a_group_falls_behind(
    browser: Any, console: ConsoleProcess, grid: Grid, unique_name: str, artefacts: Path
) -> None:

    stream = unique_name
    publish(grid, stream, ["first"])
    with Subscriber(grid, stream, group="slow", initial_offset_scheme="earliest") as reader:
        wait_until(lambda: reader.poll(100), 20, message="the first record")
        reader.confirm()  # from here on the member reads nothing and confirms nothing: the group falls behind
        load(browser, f"{console.url}groups/{stream}/slow", '#lag-chart polyline[data-lane="0"]')

        def plotted() -> tuple[str, int]:
            """The lane's line as drawn now, read in one script call (the chart is redrawn under the test)."""
            points, last = browser.execute_script(
                "const l = document.querySelector('#lag-chart polyline[data-lane=\"0\"]');"
                "return l ? [l.getAttribute('points'), l.getAttribute('data-last')] : ['', ''];"
            )
            return points or "", int(last) if last else -1

        before_points, before_last = plotted()
        sent = 0

        def behind_more() -> bool:
            nonlocal sent
            publish(grid, stream, [f"late {sent}"])  # one ring item per publish
            sent += 1
            points, last = plotted()
            return last >= before_last + 3 and points != before_points

        wait_until(behind_more, 30, 0.2, message="the chart's lane 0 to rise")
        after_points, after_last = plotted()
        print(f"lag chart lane 0: {before_last} -> {after_last} ring items behind after {sent} publishes")
        keep_shot(browser, artefacts, "group-lag-chart")
    assert after_last > before_last and after_points != before_points
    assert severe_logs(browser) == []


def test_the_tail_shows_records_published_after_the_page_opened(
    browser: Any, console: ConsoleProcess, grid: Grid, unique_name: str, artefacts: Path
) -> None:
    from selenium.webdriver.common.by import By

    stream = unique_name
    publish(grid, stream, ["before"], key="a", lanes=2)
    load(browser, f"{console.url}streams/{stream}", "#tail tr")

    def values() -> list[str]:
        found: list[str] = browser.execute_script(  # one call: rows are replaced under the test
            "return [...document.querySelectorAll('#tail tr td:last-child')].map(td => td.textContent);"
        )
        return found

    publish(grid, stream, ["after-1", "after-2"], key="a", lanes=2)
    wait_until(lambda: {"after-1", "after-2"} <= set(values()), 20, 0.1, message="the new records in the tail")
    # a key filter: only the records of key b show from then on
    browser.find_element(By.NAME, "key").send_keys("b")
    browser.find_element(By.CSS_SELECTOR, "#tail-filter button").click()
    wait_until(lambda: "after-1" not in values(), 10, 0.1, message="the table emptied by the filter")
    publish(grid, stream, ["other-key"], key="a", lanes=2)
    publish(grid, stream, ["key-b"], key="b", lanes=2)
    wait_until(lambda: "key-b" in values(), 20, 0.1, message="the key-b record")
    keep_shot(browser, artefacts, "tail")
    assert "other-key" not in values()
    assert severe_logs(browser) == []


def dead_letters(grid: Grid, source: str, dlq: str, poison: int = 5) -> None:
    """``poison`` records a JSON reader refuses: its group dead-letters each to ``dlq``."""
    with Publisher(grid, StreamConfig(source, lanes=1)) as publisher:
        publisher.publish_many([Record(f"poison {n}".encode()) for n in range(poison)] + [Record(b"{}")]).result()
    with Subscriber(
        grid,
        source,
        group="billing",
        value_deserializer="json",
        dead_letter_stream=dlq,
        initial_offset_scheme="earliest",
    ) as reader:
        wait_until(lambda: reader.poll(100), 20, message="the good record")
    info = open_stream(grid, dlq, create=False)
    wait_until(lambda: sum(n - h for h, n in lane_bounds(grid, info).values()) > 0, 10, message="dead letters")


def test_redrive_is_refused_read_only_and_runs_with_allow_actions(
    browser: Any, console: ConsoleProcess, grid: Grid, grid_settings: GridSettings, unique_name: str, artefacts: Path
) -> None:
    from selenium.webdriver.common.by import By

    source, dlq = unique_name, f"{unique_name}-dlq"
    dead_letters(grid, source, dlq)
    action = {"X-Meteor-Action": "redrive"}
    status, body = http(f"{console.url}api/dlq/{dlq}/redrive", method="POST", headers=action)
    assert status == 403 and "--allow-actions" in body["error"], body
    load(browser, f"{console.url}dlq/{dlq}", "main table")
    assert not browser.find_elements(By.ID, "redrive")  # no button on a read-only console
    before = sum(n for _, n in lane_bounds(grid, open_stream(grid, source, create=False)).values())
    with console_process(grid_settings, "--allow-actions") as acting:
        # an action without the page's header (what a form of another site could send) is refused too
        status, body = http(f"{acting.url}api/dlq/{dlq}/redrive", method="POST")
        assert status == 403 and "x-meteor-action" in body["error"], body
        load(browser, f"{acting.url}dlq/{dlq}", "#redrive")
        browser.find_element(By.ID, "redrive").click()
        result = browser.find_element(By.ID, "redrive-result")
        wait_until(lambda: result.text.startswith("redrove"), 30, 0.1, message="the redrive's answer")
        assert result.text.startswith("redrove 5,"), result.text
        redriven = "return [...document.querySelectorAll('#letters tr td:last-child')].map(td => td.textContent);"
        wait_until(lambda: browser.execute_script(redriven) == ["yes"] * 5, 20, 0.1, message="the table refreshed")
        keep_shot(browser, artefacts, "dlq-redriven")
        after = sum(n for _, n in lane_bounds(grid, open_stream(grid, source, create=False)).values())
        assert after > before
        browser.find_element(By.ID, "redrive").click()  # a second press redrives nothing again
        wait_until(lambda: "redrove 0, 5 redriven before" in result.text, 30, 0.1, message="the second answer")
    assert severe_logs(browser) == []


def test_a_token_console_refuses_requests_without_it(
    browser: Any, grid_settings: GridSettings, artefacts: Path
) -> None:
    token = "a-test-token-of-some-length"
    with console_process(grid_settings, env={"METEOR_CONSOLE_TOKEN": token}) as guarded:
        assert http(guarded.url + "api/streams")[0] == 401
        assert http(guarded.url, headers={"X-Meteor-Token": "wrong"})[0] == 401
        assert http(guarded.url + "api/streams", headers={"Authorization": f"Bearer {token}"})[0] == 200
        # a page addressed through another host name (DNS rebinding) is refused on a loopback console
        assert (
            http(guarded.url + "api/streams", headers={"Authorization": f"Bearer {token}", "Host": "evil.test"})[0]
            == 403
        )
        # the browser logs in once with ?token=, gets a cookie, and is sent on to the page without the token
        load(browser, guarded.url + f"?token={token}", "#streams")
        assert "token" not in browser.current_url
        load(browser, guarded.url + "groups", "#groups")
        assert token not in browser.page_source
    severe_logs(browser)


def test_a_non_loopback_bind_needs_a_real_token(grid_settings: GridSettings) -> None:
    """Refused before anything is bound (so no address but loopback is ever listened on here)."""
    from meteor_spark.console.security import Access

    done = subprocess.run(
        [sys.executable, "-m", "meteor_spark.cli", "console", "--host", "0.0.0.0", "--token", "short"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "--token has 5 characters" in done.stderr, done.stderr
    generated = Access.decide("0.0.0.0", None, False)
    assert generated.generated and generated.token is not None and len(generated.token) >= 40
    assert Access.decide("127.0.0.1", None, False).token is None
    assert Access.decide("::1", None, False).token is None
    assert not generated.accepts({}) and generated.accepts({"authorization": f"Bearer {generated.token}"})
