"""``meteor bench sizes --quick`` runs end to end, reports every figure and writes its plot (values are not judged:
timing never decides pass/fail)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from meteor_spark.bench import sizes, sizes_fresh, sizes_measure
from meteor_spark.errors import ConfigError
from meteor_spark.producer.batching import PublisherSettings


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sizes.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.slow
@pytest.mark.embedded_only
def test_quick_sweeps_report_every_point_and_write_the_plot(tmp_path: Path) -> None:
    png = tmp_path / "sweeps.png"
    figures = sizes.run(
        _args(
            "--quick",
            "--sizes",
            "100",
            "5000",
            "--lanes",
            "1",
            "3",
            "--megabytes",
            "1",
            "--max-records",
            "3000",
            "--max-call-bytes",
            "65536",
            "--plot",
            str(png),
        )
    )
    assert [p["record_bytes"] for p in figures["sizes"]] == [100, 5000]
    assert [p["lanes"] for p in figures["lanes"]] == [1, 3]
    assert figures["settings"]["max_call_bytes"] == 65536
    assert figures["sizes"][1]["records_per_item"] == 13 and figures["sizes"][1]["items_per_call"] == 1
    for point in figures["sizes"] + figures["lanes"]:
        rates = [value for key, value in point.items() if key.endswith("_records_s")]
        assert len(rates) >= 3 and all(rate > 0 for rate in rates)
    assert png.read_bytes().startswith(b"\x89PNG")
    printed = sizes.render(figures)
    assert "publish_many" in printed and "publish_async" in printed and "lanes (100 B records)" in printed
    assert "max_call_bytes=65,536" in printed and str(png) in printed
    assert "fresh client process" in printed


def test_the_shape_is_the_accumulators_cut_of_uniform_records() -> None:
    settings = PublisherSettings()
    assert sizes.Shape.of(settings, 100) == sizes.Shape(1000, 10)  # 100 kB items: 10 fit in 1 MiB
    assert sizes.Shape.of(settings, 10 * 1024) == sizes.Shape(102, 1)
    assert sizes.Shape.of(settings, 3 << 20) == sizes.Shape(1, 1)  # an oversized record travels alone


def test_publish_async_publishes_the_records_the_other_sides_do_up_to_its_cap() -> None:
    """Every fresh run pays a start-up of its own: a ``publish_async`` run a quarter as long as the ceiling's (as
    it was) read 0.60 of a ceiling it matched over the same bytes. Only small records are capped (one record a
    call), and the printout says so."""
    assert sizes_measure.async_records(9765) == 9765  # 100 MB of 10 KiB records
    assert sizes_measure.async_records(1525) == 1525  # 100 MB of 64 KiB records
    assert sizes_measure.async_records(1_000_000) == sizes_measure.ASYNC_MAX_RECORDS
    assert sizes_measure.async_records(0) == 1
    point = {"record_bytes": 100, "records": 1_000_000, "publish_async_records": 250_000}
    assert sizes._async_note(
        [point, {**point, "record_bytes": 10240, "records": 9765, "publish_async_records": 9765}]
    ) == [
        "publish_async published 250,000 of 1,000,000 records at 100 B (one record a call); that run pays its "
        "start-up over fewer bytes"
    ]


def test_size_labels() -> None:
    assert [sizes.size_label(n) for n in (100, 1024, 10 * 1024, 64 * 1024, 3 << 19)] == [
        "100 B",
        "1 KiB",
        "10 KiB",
        "64 KiB",
        "1.5 MiB",
    ]


def test_bad_options_are_refused_before_anything_runs() -> None:
    with pytest.raises(ConfigError, match="--repeats must be >= 1, got 0"):
        sizes.SizesBenchOptions.from_args(_args("--repeats", "0"))
    with pytest.raises(ConfigError, match="max_call_bytes must be an integer"):
        sizes.SizesBenchOptions.from_args(_args("--max-call-bytes", "0"))
    with pytest.raises(ConfigError, match=r"--lanes must be 1\.\.64"):
        sizes.SizesBenchOptions.from_args(_args("--lanes", "0"))


def test_plot_without_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'meteor-spark\[notebook\]'"):
        sizes.run(_args("--quick", "--plot", "x.png"))


@pytest.mark.slow
@pytest.mark.embedded_only
def test_lane_sweep_alone_keyed_and_keyless_each_against_one_lane() -> None:
    figures = sizes.run(
        _args("--quick", "--lanes-only", "--keyed", "--lanes", "1", "4", "--max-records", "2000", "--linger-ms", "1")
    )
    assert figures["sizes"] == [] and figures["settings"]["linger_ms"] == 1.0
    assert [(p["lanes"], p["keyed"]) for p in figures["lanes"]] == [(1, False), (4, False), (1, True), (4, True)]
    assert all(p["publish_many_records_s"] > 0 and p["consume_records_s"] > 0 for p in figures["lanes"])
    printed = sizes.render(figures)
    assert "vs 1 lane" in printed and "keyed" in printed and "linger_ms=1" in printed
    assert "publish_async" not in printed  # no size sweep


@pytest.mark.slow
@pytest.mark.embedded_only
def test_the_size_sweep_runs_each_side_in_a_fresh_process_with_and_without_the_allocator_settings() -> None:
    figures = sizes.run(
        _args("--quick", "--sizes", "10240", "--lanes", "1", "--max-records", "300", "--allocator", "both")
    )
    assert figures["settings"]["process"] == "fresh"
    assert [(p["record_bytes"], p["allocator"]) for p in figures["sizes"]] == [(10240, "tuned"), (10240, "off")]
    for point in figures["sizes"]:
        assert set(point["minor_faults"]) == {"ceiling", "publish_many", "consume", "publish_async"}
        assert all(faults >= 0 for faults in point["minor_faults"].values())
        assert set(point["cpu_ms_per_mb"]) == set(point["minor_faults"])
        assert all(cpu >= 0 for cpu in point["cpu_ms_per_mb"].values())
        assert point["publish_many_records_s"] > 0 and point["consume_records_s"] > 0
        assert point["publish_async_records"] == point["records"] == 300  # the same records as the other sides
        if sys.platform.startswith("linux"):
            assert set(point["member_minor_faults"]) == set(point["member_cpu_ms_per_mb"]) == set(point["minor_faults"])
    printed = sizes.render(figures)
    assert "publish_async published" not in printed
    assert "fresh client process" in printed and "minor faults" in printed and "client CPU ms/MB" in printed
    assert "member minor faults" in printed


def test_every_side_meets_a_warmed_member_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """One member for the whole sweep gave the sides unequal members: the side writing while ``publish_many``'s
    stream was alive (``publish_async``) found no freed memory and faulted ~100 MB of new pages in the member, the
    others none. Now each side (``consume`` with the ``publish_many`` it reads) gets a member warmed with as many
    bytes before it runs."""
    events: list[tuple[Any, ...]] = []

    class Member:
        count = 0

        def __enter__(self) -> Member:
            Member.count += 1
            self.address, self.cluster_name, self.pid = f"127.0.0.1:{5700 + Member.count}", "bench", 1000 + Member.count
            events.append(("member", self.address))
            return self

        def __exit__(self, *exc: object) -> None:
            events.append(("stopped", self.address))

    def run_fresh(member_pid: int | None, args: tuple[Any, ...]) -> sizes_fresh.Measured:
        side, settings = args[0], args[1]
        events.append((side, settings.members[0], member_pid))
        return sizes_fresh.Measured(1.0, 0, 0.5, 0, 0.1)

    monkeypatch.setattr(sizes_fresh, "EmbeddedGrid", lambda **kwargs: Member())
    monkeypatch.setattr(sizes_fresh, "_run_fresh", run_fresh)
    monkeypatch.setattr(
        sizes_fresh, "warm_member", lambda settings, shape, size, n: events.append(("warm", settings.members[0], n))
    )
    options = sizes.SizesBenchOptions.from_args(_args("--megabytes", "1", "--repeats", "2"))
    [point] = sizes_fresh.size_points(options, 10240, (True,))
    n = 1_000_000 // 10240
    one_repeat = [
        [("member", m), ("warm", m, n), *[(side, m, 1000 + k) for side in group], ("stopped", m)]
        for k, m, group in (
            (1, "127.0.0.1:5701", ["ceiling"]),
            (2, "127.0.0.1:5702", ["publish_many", "consume"]),
            (3, "127.0.0.1:5703", ["publish_async"]),
        )
    ]
    assert events[:13] == [event for group in one_repeat for event in group]
    assert len(events) == 26 and Member.count == 6
    assert point["member_minor_faults"] == {"ceiling": 0, "publish_many": 0, "consume": 0, "publish_async": 0}
    assert point["publish_async_records"] == point["records"] == n


def test_process_usage_reads_faults_and_cpu_where_proc_exists() -> None:
    assert sizes_fresh.process_usage(None) is None
    usage = sizes_fresh.process_usage(os.getpid())
    if sys.platform.startswith("linux"):
        assert usage is not None and usage[0] > 0 and usage[1] >= 0


def test_the_allocator_choice_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"--allocator must be one of tuned, off, both.*got 'sometimes'"):
        sizes.SizesBenchOptions.from_args(_args("--allocator", "sometimes"))
    with pytest.raises(ConfigError, match="only tuned with --warm"):
        sizes.SizesBenchOptions.from_args(_args("--warm", "--allocator", "off"))


def test_a_bad_linger_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match="linger_ms"):
        sizes.SizesBenchOptions.from_args(_args("--linger-ms", "-1"))
