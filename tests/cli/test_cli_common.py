"""Output helpers of the ``meteor`` command: tables, times, and the progress line (only on a terminal)."""

from __future__ import annotations

import io

from meteor_spark.cli.common import Progress, fmt_time_ms, render_table


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_render_table_pads_columns_and_right_aligns_numbers() -> None:
    table = render_table(["NAME", "COUNT"], [["a", "1,000"], ["longer", "7"]], right=[1])
    assert table.splitlines() == [
        "NAME    COUNT",
        "------  -----",
        "a       1,000",
        "longer      7",
    ]


def test_fmt_time_ms_is_utc_iso_with_milliseconds() -> None:
    assert fmt_time_ms(1_700_000_000_123) == "2023-11-14T22:13:20.123Z"
    assert fmt_time_ms(None) == "-"


def test_progress_draws_on_a_terminal_and_stays_silent_in_a_pipe() -> None:
    terminal = _Terminal()
    progress = Progress("publishing", total_bytes=1000, stream=terminal)
    progress.update(500, 500, force=True)
    progress.finish()
    drawn = terminal.getvalue()
    assert drawn.startswith("\rpublishing: 500 (") and "50%" in drawn and drawn.endswith("\r\033[K")

    pipe = io.StringIO()
    silent = Progress("publishing", total_bytes=1000, stream=pipe)
    silent.update(500, 500, force=True)
    silent.finish()
    assert pipe.getvalue() == ""
