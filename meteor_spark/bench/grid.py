"""``meteor bench grid``: the embedded grid under the official client, next to a loopback-socket ceiling.

Measured against a member in its own process (``EmbeddedGrid(process=True)``), through ``meteor_spark.grid.client``:

- ring ingest: ``add_all`` of batches of 64 KiB items (MB/s; latency per call p50/p99);
- ring read: ``read_many`` of the same batches (MB/s; p50/p99 per call);
- map: small ``put`` / ``get`` round trips (ops/s; p50/p99), when the member serves maps, and the member process's
  CPU per request (user + system, from ``/proc``: what a shared machine's noisy latencies hide);
- ring hop: one small ``add`` completing a ``read_many`` another client parked before it (the member's hop of the
  publish -> poll round trip; p50/p99, and the member's CPU per round);
- ceiling: the same bytes through a plain loopback TCP socket to/from another process, and a small-message
  ping-pong round trip, measured in the same run. Ratios are ours / ceiling.

Calls are issued one at a time (``--inflight 1``, what a simple client does) or with several in flight.

``--members HOST:PORT[,...]`` runs the same ring and map workload, in the same run, against that cluster too (a
real Hazelcast cluster, say), and prints both side by side with their ratio (cluster / embedded): the embedded grid
stands in for Hazelcast in tests and demos, and this is how far apart the two are on the machine at hand. The ring
workload runs on the cluster after the embedded grid; the map workload runs on both in turn, a warm-up round each
and then ``MAP_ROUNDS`` rounds whose medians are printed, with the cluster's member CPU per request when it is one
member on this machine. The cluster gets a ring of its own for the run (capacity for every item, backups as a
stream's default, ``backup_count=1``), destroyed afterwards with the map.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from meteor_spark.bench import check_at_least_one
from meteor_spark.errors import ConfigError
from meteor_spark.grid.client import Grid, GridSettings, split_members
from meteor_spark.server import EmbeddedGrid, RingConfig
from meteor_spark.tables import render_table

MB = 1024 * 1024


@dataclass(frozen=True)
class GridBenchOptions:
    item_bytes: int
    batch_items: int
    total_mb: int
    map_ops: int
    inflight: int
    members: tuple[str, ...] = ()
    cluster_name: str = "dev"
    busy_poll_us: int | None = None  # None: the member's default

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> GridBenchOptions:
        quick = bool(getattr(args, "quick", False))
        settings = cls(
            item_bytes=args.item_kb * 1024,
            batch_items=args.batch,
            total_mb=args.total_mb if args.total_mb is not None else (16 if quick else 256),
            map_ops=args.map_ops if args.map_ops is not None else (300 if quick else 5000),
            inflight=args.inflight,
            members=split_members(getattr(args, "members", None) or ()),
            cluster_name=getattr(args, "cluster_name", None) or "dev",
            busy_poll_us=getattr(args, "busy_poll_us", None),
        )
        if settings.members:
            GridSettings(members=settings.members, cluster_name=settings.cluster_name)  # ConfigError naming a bad one
        if not 1 <= settings.batch_items <= 999:
            raise ConfigError(
                f"--batch must be 1..999 items (Hazelcast's read_many/add_all limit), got {settings.batch_items}"
            )
        check_at_least_one(settings, ("inflight",))
        return settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds): 16 MiB, 300 map ops")
    parser.add_argument("--item-kb", type=int, default=64, help="ring item size in KiB (default 64)")
    parser.add_argument("--batch", type=int, default=16, help="items per add_all/read_many call (default 16)")
    parser.add_argument("--total-mb", type=int, default=None, help="MiB written and read (default 256)")
    parser.add_argument("--map-ops", type=int, default=None, help="map put and get round trips each (default 5000)")
    parser.add_argument("--inflight", type=int, default=1, help="ring calls in flight at once (default 1)")
    parser.add_argument(
        "-m",
        "--members",
        metavar="HOST:PORT[,...]",
        default=None,
        help="also run the ring and map workload against this cluster (e.g. real Hazelcast members) and print it "
        "next to the embedded grid with their ratio",
    )
    parser.add_argument("--cluster-name", metavar="NAME", default=None, help="cluster name of --members (default dev)")
    parser.add_argument(
        "--busy-poll-us",
        type=int,
        default=None,
        metavar="US",
        help="start the embedded member with --busy-poll-us US (adaptive polling after each request; 0 = off; "
        "default: the member's default)",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = GridBenchOptions.from_args(args)
    batches = max(1, settings.total_mb * MB // (settings.item_bytes * settings.batch_items))
    items_total = batches * settings.batch_items
    ring_name = "bench.grid.ring"
    # The cluster is reached first, so a wrong address fails before minutes of embedded measurements.
    cluster = None
    if settings.members:
        cluster = Grid(GridSettings(members=settings.members, cluster_name=settings.cluster_name))
    try:
        with (
            EmbeddedGrid(
                process=True,
                ring_configs=[RingConfig(ring_name, capacity=items_total + 1)],
                busy_poll_us=settings.busy_poll_us,
            ) as member,
            Grid(GridSettings(members=(member.address,), cluster_name=member.cluster_name)) as grid,
        ):
            ingest, read = _ring(grid, ring_name, settings, batches)
            if cluster is None:
                map_figures = _map(grid, settings.map_ops, member_pid=member.pid)
            else:
                map_figures = _map_rounds(grid, member.pid, cluster, settings)
            with Grid(GridSettings(members=(member.address,), cluster_name=member.cluster_name)) as reader:
                map_figures.update(_ring_hop(grid, reader, "bench.grid.hop", settings.map_ops, member.pid))
        cluster_figures = None if cluster is None else _cluster(cluster, settings, batches, items_total)
    finally:
        if cluster is not None:
            cluster.close()
    ceiling = _ceiling(settings.item_bytes * settings.batch_items, batches, settings.map_ops)
    figures: dict[str, Any] = {
        **_ring_figures(ingest, read),
        "ceiling_send_mb_s": ceiling["send_mb_s"],
        "ceiling_recv_mb_s": ceiling["recv_mb_s"],
        "ceiling_rtt_p50_us": ceiling["rtt_p50_us"],
        **{name: value for name, value in map_figures.items() if not name.startswith(_CLUSTER)},
        "settings": settings.__dict__,
    }
    if cluster_figures is not None:
        cluster_figures.update(
            {name.removeprefix(_CLUSTER): value for name, value in map_figures.items() if name.startswith(_CLUSTER)}
        )
        figures["cluster"] = cluster_figures
    return figures


#: Rounds of the map workload on each side when a cluster is compared: the sides take turns, so a slow moment of a
#: shared machine, or its idle cores' wake-up latency, weighs on both; each figure is the median of the rounds.
MAP_ROUNDS = 5

#: The prefix of the cluster's figures among ``_map_rounds``' (the embedded member's have none).
_CLUSTER = "cluster_"


def _map_rounds(grid: Grid, member_pid: int | None, cluster: Grid, settings: GridBenchOptions) -> dict[str, Any]:
    """The map workload on the embedded member and the cluster in turn, ``MAP_ROUNDS`` times after one warm-up
    round each (a JVM compiles its hot paths over the first thousands of requests): the medians of the rounds, the
    cluster's under ``cluster_`` names. The cluster's member CPU per request is measured too when it is one member
    on this machine (its process found by its listening port)."""
    suffix = uuid.uuid4().hex[:8]
    map_name = f"bench.grid.map.{suffix}"
    cluster_pid = local_listener_pid(settings.members[0]) if len(settings.members) == 1 else None
    sides = [("", grid, "bench.grid.map", member_pid), (_CLUSTER, cluster, map_name, cluster_pid)]
    rounds: dict[str, list[float]] = {}
    try:
        for _, side, name, pid in sides:
            _map(side, settings.map_ops, name, pid)
        for index in range(MAP_ROUNDS):
            for prefix, side, name, pid in sides if index % 2 == 0 else sides[::-1]:
                for key, value in _map(side, settings.map_ops, name, pid).items():
                    rounds.setdefault(prefix + key, []).append(value)
    finally:
        cluster.client.get_map(map_name).blocking().destroy()
    return {key: statistics.median(values) for key, values in rounds.items()}


def local_listener_pid(address: str) -> int | None:
    """The process listening on ``address`` (host:port) on this machine, from ``/proc`` (None when there is none
    this user may see, or off Linux)."""
    port = int(address.rsplit(":", 1)[1])
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                rows = [line.split() for line in lines.readlines()[1:]]
        except OSError:
            continue
        inodes.update(row[9] for row in rows if int(row[1].rsplit(":", 1)[1], 16) == port and row[3] == "0A")
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for pid in filter(str.isdigit, os.listdir("/proc") if wanted else ()):
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in wanted for fd in os.listdir(f"/proc/{pid}/fd")):
                return int(pid)
        except OSError:
            continue
    return None


def _ring_figures(ingest: Throughput, read: Throughput) -> dict[str, float]:
    """The ring figures of one grid, as ``run`` reports them."""
    return {
        "ring_ingest_mb_s": ingest.mb_s,
        "ring_ingest_p50_ms": ingest.p50_ms,
        "ring_ingest_p99_ms": ingest.p99_ms,
        "ring_read_mb_s": read.mb_s,
        "ring_read_p50_ms": read.p50_ms,
        "ring_read_p99_ms": read.p99_ms,
    }


def _cluster(grid: Grid, settings: GridBenchOptions, batches: int, items_total: int) -> dict[str, Any]:
    """The ring workload against ``grid`` (the --members cluster), on rings of its own (its map figures come from
    ``_map_rounds``)."""
    suffix = uuid.uuid4().hex[:8]
    ring_name = f"bench.grid.ring.{suffix}"
    grid.add_ring_config(ring_name, capacity=items_total + 1, backups=1)
    members = grid.members()
    hop_name = f"bench.grid.hop.{suffix}"
    try:
        ingest, read = _ring(grid, ring_name, settings, batches)
        with Grid(GridSettings(members=settings.members, cluster_name=settings.cluster_name)) as reader:
            hop = _ring_hop(grid, reader, hop_name, settings.map_ops)
    finally:
        grid.ring(ring_name).destroy()
        grid.ring(hop_name).destroy()
    return {
        "members": len(members),
        "versions": sorted({version for _, _, version in members}),
        **_ring_figures(ingest, read),
        **hop,
    }


@dataclass(frozen=True)
class Throughput:
    mb_s: float
    p50_ms: float
    p99_ms: float


def _ring(grid: Grid, name: str, settings: GridBenchOptions, batches: int) -> tuple[Throughput, Throughput]:
    ring = grid.ring(name)
    batch = [os.urandom(settings.item_bytes)] * settings.batch_items
    batch_bytes = settings.item_bytes * settings.batch_items
    ring.add_all(batch)  # warm-up (connection, proxy, capacity cache)
    start_sequence = ring.tail() + 1

    def write(index: int) -> Any:
        return ring.add_all_async(batch)

    ingest = _timed(write, batches, batch_bytes, settings.inflight)

    def read(index: int) -> Any:
        first = start_sequence + index * settings.batch_items
        return ring.read_many_async(first, settings.batch_items, settings.batch_items)

    reading = _timed(read, batches, batch_bytes, settings.inflight)
    return ingest, reading


def _timed(call: Callable[[int], Any], count: int, batch_bytes: int, inflight: int) -> Throughput:
    latencies: list[float] = []
    pending: list[tuple[float, Any]] = []
    started = time.perf_counter()
    for index in range(count):
        pending.append((time.perf_counter(), call(index)))
        if len(pending) >= inflight:
            sent, future = pending.pop(0)
            future.result()
            latencies.append(time.perf_counter() - sent)
    for sent, future in pending:
        future.result()
        latencies.append(time.perf_counter() - sent)
    elapsed = time.perf_counter() - started
    return Throughput(count * batch_bytes / MB / elapsed, _pct(latencies, 50) * 1e3, _pct(latencies, 99) * 1e3)


def _process_cpu_s(pid: int | None) -> float | None:
    """CPU seconds (user + system) process ``pid`` used so far, from ``/proc`` (None off Linux or without a pid)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _map(grid: Grid, ops: int, name: str = "bench.grid.map", member_pid: int | None = None) -> dict[str, Any]:
    """Map put / get round trips; with ``member_pid`` (the embedded member's process) also its CPU per request,
    which the wall-clock latencies of a shared machine hide."""
    grid_map: Any = grid.client.get_map(name).blocking()
    value = bytearray(b"v" * 100)
    try:
        grid_map.put("k0", value)
    except Exception as exc:  # the member may not serve maps (yet)
        return {"map": f"not available ({type(exc).__name__}: {str(exc)[:80]})"}
    puts: list[float] = []
    gets: list[float] = []
    member_cpu = _process_cpu_s(member_pid)
    started = time.perf_counter()
    for index in range(ops):
        t0 = time.perf_counter()
        grid_map.put(f"k{index % 100}", value)
        t1 = time.perf_counter()
        grid_map.get(f"k{index % 100}")
        t2 = time.perf_counter()
        puts.append(t1 - t0)
        gets.append(t2 - t1)
    elapsed = time.perf_counter() - started
    member_cpu_after = _process_cpu_s(member_pid)
    cpu: dict[str, float] = {}
    if member_cpu is not None and member_cpu_after is not None:
        cpu["map_member_cpu_us"] = (member_cpu_after - member_cpu) / (2 * ops) * 1e6
    return {
        **cpu,
        "map_ops_s": 2 * ops / elapsed,
        "map_put_p50_us": _pct(puts, 50) * 1e6,
        "map_put_p99_us": _pct(puts, 99) * 1e6,
        "map_get_p50_us": _pct(gets, 50) * 1e6,
        "map_get_p99_us": _pct(gets, 99) * 1e6,
    }


def _ring_hop(writer: Grid, reader: Grid, name: str, ops: int, member_pid: int | None = None) -> dict[str, float]:
    """One small ``add`` from ``writer`` completing a ``read_many`` that ``reader`` (another client) parked before
    it: the member's hop of the publish -> poll round trip. Before each add a ``tail`` on the reader's connection
    proves its read reached the member (a connection's requests are served in order), so every read is parked;
    with ``member_pid``, the member's CPU per round (add + parked read_many + that probe)."""
    ring, reading = writer.ring(name), reader.ring(name)
    item = os.urandom(100)
    first = ring.add(item) + 1
    hops: list[float] = []
    member_cpu = _process_cpu_s(member_pid)
    for sequence in range(first, first + ops):
        parked = reading.read_many_async(sequence, 1, 1)
        reading.tail()
        started = time.perf_counter()
        added = ring.add_async(item)
        parked.result()
        hops.append(time.perf_counter() - started)
        added.result()
    member_cpu_after = _process_cpu_s(member_pid)
    figures = {"ring_hop_p50_us": _pct(hops, 50) * 1e6, "ring_hop_p99_us": _pct(hops, 99) * 1e6}
    if member_cpu is not None and member_cpu_after is not None:
        figures["ring_hop_member_cpu_us"] = (member_cpu_after - member_cpu) / ops * 1e6
    return figures


def _pct(values: list[float], percent: int) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[percent - 1]


# ------------------------------------------------------------------------------------------------ ceiling


def _peer(port_queue: Any, chunk: int, count: int, rtt_ops: int) -> None:
    """The other process of the ceiling: sink ``count`` chunks, ack, source ``count`` chunks, then echo pings."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port_queue.put(server.getsockname()[1])
    conn, _ = server.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    remaining = chunk * count
    buffer = bytearray(4 * MB)
    while remaining:
        got = conn.recv_into(buffer, min(len(buffer), remaining))
        if not got:
            return
        remaining -= got
    conn.sendall(b"k")
    payload = os.urandom(chunk)
    for _ in range(count):
        conn.sendall(payload)
    for _ in range(rtt_ops):
        message = conn.recv(64)
        if not message:
            return
        conn.sendall(message)
    conn.close()
    server.close()


def _ceiling(chunk: int, count: int, rtt_ops: int) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    ports = context.Queue()
    peer = context.Process(target=_peer, args=(ports, chunk, count, rtt_ops), daemon=True)
    peer.start()
    try:
        sock = socket.create_connection(("127.0.0.1", ports.get(timeout=30)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        payload = os.urandom(chunk)
        started = time.perf_counter()
        for _ in range(count):
            sock.sendall(payload)
        sock.recv(1)
        send_mb_s = chunk * count / MB / (time.perf_counter() - started)
        remaining = chunk * count
        buffer = bytearray(4 * MB)
        started = time.perf_counter()
        while remaining:
            got = sock.recv_into(buffer, min(len(buffer), remaining))
            if not got:
                raise OSError("ceiling peer closed early")
            remaining -= got
        recv_mb_s = chunk * count / MB / (time.perf_counter() - started)
        rtts = []
        message = struct.pack("<q", 1) * 4
        for _ in range(rtt_ops):
            t0 = time.perf_counter()
            sock.sendall(message)
            sock.recv(64)
            rtts.append(time.perf_counter() - t0)
        sock.close()
        return {"send_mb_s": send_mb_s, "recv_mb_s": recv_mb_s, "rtt_p50_us": _pct(rtts, 50) * 1e6}
    finally:
        peer.join(10)
        if peer.is_alive():
            peer.kill()


def render(figures: dict[str, Any]) -> str:
    """The figures of ``run`` as the table ``meteor bench grid`` prints."""

    def ratio(ours: float, ceiling: float) -> str:
        return f"{ours / ceiling:6.1%}" if ceiling else "  n/a"

    rows = [
        (
            "ring ingest (add_all)",
            f"{figures['ring_ingest_mb_s']:8.1f} MB/s",
            f"p50 {figures['ring_ingest_p50_ms']:6.2f} ms  p99 {figures['ring_ingest_p99_ms']:6.2f} ms",
            f"{figures['ceiling_send_mb_s']:8.1f} MB/s",
            ratio(figures["ring_ingest_mb_s"], figures["ceiling_send_mb_s"]),
        ),
        (
            "ring read (read_many)",
            f"{figures['ring_read_mb_s']:8.1f} MB/s",
            f"p50 {figures['ring_read_p50_ms']:6.2f} ms  p99 {figures['ring_read_p99_ms']:6.2f} ms",
            f"{figures['ceiling_recv_mb_s']:8.1f} MB/s",
            ratio(figures["ring_read_mb_s"], figures["ceiling_recv_mb_s"]),
        ),
    ]
    if "map_ops_s" in figures:
        rows.append(
            (
                "map put+get",
                f"{figures['map_ops_s']:8.0f} ops/s",
                f"put p50 {figures['map_put_p50_us']:5.0f} us p99 {figures['map_put_p99_us']:6.0f} us; "
                f"get p50 {figures['map_get_p50_us']:5.0f} us p99 {figures['map_get_p99_us']:6.0f} us",
                f"rtt {figures['ceiling_rtt_p50_us']:5.0f} us",
                ratio(figures["ceiling_rtt_p50_us"], figures["map_get_p50_us"]),
            )
        )
        if "map_member_cpu_us" in figures:
            rows.append(("  member CPU per request", f"{figures['map_member_cpu_us']:8.1f} us", "", "", ""))
    if "ring_hop_p50_us" in figures:
        rows.append(
            (
                "add -> parked read_many",
                "",
                f"p50 {figures['ring_hop_p50_us']:5.0f} us p99 {figures['ring_hop_p99_us']:6.0f} us",
                "",
                "",
            )
        )
        if "ring_hop_member_cpu_us" in figures:
            cpu = f"{figures['ring_hop_member_cpu_us']:8.1f} us"
            rows.append(("  member CPU per round", cpu, "add + parked read_many + a tail probe", "", ""))
    else:
        rows.append(("map put+get", figures.get("map", "not available"), "", "", ""))
    table = render_table(("measure", "ours", "latency per call", "ceiling", "ratio"), rows)
    text = (
        table
        + "\n"
        + (
            "targets: ring ingest >= 250 MB/s, ring read >= 450 MB/s, map p50 <= 250 us, p99 <= 2 ms; "
            "the ceiling is a plain loopback socket to another process (map ratio = socket rtt / map get p50)"
        )
    )
    if "cluster" in figures:
        text += "\n\n" + render_cluster(figures)
    return text


#: (label, key, unit, format) of each figure compared between the embedded grid and the --members cluster.
COMPARED = (
    ("ring ingest (add_all)", "ring_ingest_mb_s", "MB/s", "{:.1f}"),
    ("  p50 per call", "ring_ingest_p50_ms", "ms", "{:.2f}"),
    ("  p99 per call", "ring_ingest_p99_ms", "ms", "{:.2f}"),
    ("ring read (read_many)", "ring_read_mb_s", "MB/s", "{:.1f}"),
    ("  p50 per call", "ring_read_p50_ms", "ms", "{:.2f}"),
    ("  p99 per call", "ring_read_p99_ms", "ms", "{:.2f}"),
    ("map put+get", "map_ops_s", "ops/s", "{:.0f}"),
    ("  put p50", "map_put_p50_us", "us", "{:.0f}"),
    ("  put p99", "map_put_p99_us", "us", "{:.0f}"),
    ("  get p50", "map_get_p50_us", "us", "{:.0f}"),
    ("  get p99", "map_get_p99_us", "us", "{:.0f}"),
    ("  member CPU per request", "map_member_cpu_us", "us", "{:.1f}"),
    ("add -> parked read_many p50", "ring_hop_p50_us", "us", "{:.0f}"),
    ("add -> parked read_many p99", "ring_hop_p99_us", "us", "{:.0f}"),
)


def render_cluster(figures: dict[str, Any]) -> str:
    """The embedded grid next to the --members cluster, figure by figure, with the ratio cluster / embedded."""
    cluster = figures["cluster"]
    settings = figures.get("settings", {})
    members = ",".join(settings.get("members", ())) or "?"
    rows = []
    for label, key, unit, fmt in COMPARED:
        ours, theirs = figures.get(key), cluster.get(key)
        if not isinstance(ours, (int, float)) or not isinstance(theirs, (int, float)):
            rows.append((label, "n/a", "n/a", "", unit))
            continue
        ratio = f"{theirs / ours:.2f}x" if ours else "n/a"
        rows.append((label, fmt.format(ours), fmt.format(theirs), ratio, unit))
    table = render_table(("measure", "embedded", "cluster", "cluster/embedded", "unit"), rows, right=[1, 2, 3])
    return (
        f"embedded grid vs cluster {members} ({cluster['members']} member(s), Hazelcast "
        f"{', '.join(cluster['versions'])}), same workload, same run:\n{table}\n"
        "throughput: a ratio above 1 means the cluster is faster; latency: below 1 means the cluster is faster"
    )


__all__ = ["add_arguments", "run"]
