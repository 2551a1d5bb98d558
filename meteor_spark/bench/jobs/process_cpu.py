"""CPU time of a Spark benchmark's processes by kind, read from ``/proc``: what a run costs the JVM (Spark's own
work: reading the input, Arrow batches to and from Python, the sink), the Python workers (the data source's
Python side and PySpark's worker around it), the grid member and the driver process.

Wall time on a shared 2-core machine moves by tens of percent between runs; CPU time per record moves far less,
and split by process it says how much of a path is Spark's and how much is the connector's, which a throughput
ratio alone cannot.

Attribution: the driver is this process; its descendants named ``java`` are the JVM (own user + system time
only); every other descendant is a Python process, split in two by what it runs:

* ``python tasks``: PySpark's task workers, the ``pyspark.daemon`` serving ``pyspark.worker`` and the workers it
  forks (their time once reaped by the daemon too): where a data source's ``read`` and ``write`` run, with
  PySpark's Arrow transfer around them. The connector's own work is the difference to a ceiling's here.
* ``python planning``: every other Python process Spark starts (the daemons and workers that look up, create and
  plan a Python data source, and the source runner of a streaming query, which starts with each query and exits
  with it), plus the Python processes the JVM reaped: mostly a fixed cost per query or job (starting a Python
  process and importing PySpark and pyarrow takes about a second of CPU each), which per record depends on how
  many records the run has, not on the data source's per-record work.

The member is given by pid (the embedded grid runs in its own process). Where ``/proc`` cannot be read (not Linux),
``sample`` returns None and the benchmark prints no CPU figures.

A job's Python processes keep working after Spark reported it done: a reused worker runs a full garbage collection
after every task, 25-55 ms of CPU each on these machines, and the worker that committed a write does the same.
``settle`` waits for that to end, so it is counted with the job that caused it, not inside the next one's time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

#: The kinds a sample splits CPU time into, in the order the benchmark prints them.
KINDS = ("jvm", "python tasks", "python planning", "member", "driver")

#: What the command line of a PySpark task worker (its daemon, and the workers it forks) holds.
_TASK_WORKER = "pyspark.daemon pyspark.worker"

_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def sample(member_pid: int | None) -> dict[str, float] | None:
    """CPU seconds used so far per kind (``KINDS``); None where ``/proc`` is not readable."""
    table = _processes()
    if table is None:
        return None
    me = os.getpid()
    seconds = dict.fromkeys(KINDS, 0.0)
    for pid in _descendants(table, me):
        if pid == member_pid:
            continue
        _parent, name, own, reaped = table[pid]
        if name == "java":
            seconds["jvm"] += own
            seconds["python planning"] += reaped  # the Python processes it started and reaped
        elif _is_task_worker(pid):
            seconds["python tasks"] += own + reaped
        else:
            seconds["python planning"] += own + reaped
    if me in table:
        seconds["driver"] += table[me][2]
    if member_pid is not None and member_pid in table:
        seconds["member"] += table[member_pid][2]
    return seconds


#: ``settle``: the Python processes and the member are idle once they use less than this share of one core...
QUIET_SHARE = 0.05
#: ...over a window this long...
QUIET_WINDOW_S = 0.1
#: ...or this long has passed (a busy machine never gets that quiet; the run goes on).
SETTLE_TIMEOUT_S = 3.0


def settle(member_pid: int | None) -> float:
    """Wait until the Python processes and the member are idle (``QUIET_SHARE`` of a core over
    ``QUIET_WINDOW_S``) or ``SETTLE_TIMEOUT_S`` passed; returns the seconds waited. The JVM is not waited for: its
    compiler works on for seconds after the first jobs of a session, on both sides of a comparison alike."""
    started = time.monotonic()
    last = _python_seconds(sample(member_pid))
    if last is None:
        return 0.0
    while time.monotonic() - started < SETTLE_TIMEOUT_S:
        time.sleep(QUIET_WINDOW_S)
        now = _python_seconds(sample(member_pid))
        if now is None or now - last < QUIET_SHARE * QUIET_WINDOW_S:
            break
        last = now
    return time.monotonic() - started


def _python_seconds(seconds: Mapping[str, float] | None) -> float | None:
    if seconds is None:
        return None
    return seconds["python tasks"] + seconds["python planning"] + seconds["member"]


def per_record(before: Mapping[str, float] | None, after: Mapping[str, float] | None, records: int) -> dict[str, float]:
    """Nanoseconds of CPU per record per kind between two samples, plus ``total``; empty without samples."""
    if before is None or after is None or records <= 0:
        return {}
    figures = {kind: 1e9 * max(0.0, after[kind] - before[kind]) / records for kind in KINDS}
    figures["total"] = sum(figures.values())
    return figures


def _is_task_worker(pid: int) -> bool:
    """Whether ``pid`` runs PySpark's task worker (forked workers keep their daemon's command line)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return _TASK_WORKER in cmdline.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:  # exited while listed
        return False


def _processes() -> dict[int, tuple[int, str, float, float]] | None:
    """pid -> (parent pid, name, own CPU seconds, reaped children's CPU seconds) of every process visible."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    table: dict[int, tuple[int, str, float, float]] = {}
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as stat:
                text = stat.read()
        except OSError:  # exited while listed
            continue
        # The name is in parentheses and may hold spaces; the fields after it are space-separated.
        name = text[text.find("(") + 1 : text.rfind(")")]
        fields = text[text.rfind(")") + 2 :].split()
        utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
        table[int(entry)] = (int(fields[1]), name, (utime + stime) / _TICKS_PER_S, (cutime + cstime) / _TICKS_PER_S)
    return table


def _descendants(table: Mapping[int, tuple[int, str, float, float]], root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (parent, *_rest) in table.items():
        children.setdefault(parent, []).append(pid)
    found, frontier = [], list(children.get(root, ()))
    while frontier:
        pid = frontier.pop()
        found.append(pid)
        frontier.extend(children.get(pid, ()))
    return found
