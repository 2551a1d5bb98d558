"""Grid access: the one module that imports ``hazelcast``.

It turns connection settings (``GridSettings``, in ``meteor_spark.grid.settings``) into a
``hazelcast.HazelcastClient``, gives the rest of the project thin, typed
views of ring buffers, maps and atomic longs holding ``bytes``/``str``, and translates Hazelcast errors into
``meteor_spark.errors`` (in ``translate_errors`` and nowhere else).

The frame-size constants of ``settings`` are re-exported here (``X as X``): code written before ``settings`` held
them imports them from this module.

The same code path serves the embedded grid and a real Hazelcast 5.x cluster: nothing here may depend on
behaviour only the embedded grid has.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import hazelcast
from hazelcast import errors as hz_errors
from hazelcast.future import Future

from meteor_spark.allocator import tune_allocator
from meteor_spark.compat import (
    add_ringbuffer_config_request,
    connect_failures,
    fix_partial_send_copies,
    invoke,
    on_connection_closed,
)
from meteor_spark.compat_frames import fix_frame_reader
from meteor_spark.compat_reactor import fix_reactor_waker_race, sleep_until_next_timer
from meteor_spark.compat_ring import add_all_async as ring_add_all_async
from meteor_spark.compat_ring import fix_future_event, read_items_as_bytes
from meteor_spark.compat_ring import read_many_async as ring_read_many_async
from meteor_spark.errors import (
    ArgumentTypeError,
    ConfigError,
    GridConnectionError,
    GridError,
    GridOperationError,
)
from meteor_spark.grid.settings import DEFAULT_ADDRESS, GridSettings, check_tls_files, split_members

logger = logging.getLogger(__name__)


fix_reactor_waker_race()  # private client details, version-guarded in meteor_spark.compat
sleep_until_next_timer()
fix_partial_send_copies()
fix_future_event()
fix_frame_reader()

T = TypeVar("T")

#: Ring-buffer overflow policies, as Hazelcast numbers them.
OVERWRITE = 0
FAIL = 1

#: Hazelcast refuses read_many/add_all batches of 1000 items or more (client-side check).
MAX_BATCH_ITEMS = 999

_CONNECTION_ERRORS = (
    hz_errors.IllegalStateError,  # "Unable to connect to any cluster" after cluster_connect_timeout
    hz_errors.AuthenticationError,
    hz_errors.TargetDisconnectedError,
    hz_errors.HazelcastClientNotActiveError,
    hz_errors.HazelcastInstanceNotActiveError,
    OSError,
)


@contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """Translate Hazelcast client errors raised inside the block into ``meteor_spark.errors``."""
    try:
        yield
    except (hz_errors.HazelcastError, OSError, AssertionError) as exc:
        translated = _translated(exc, what)
        if translated is None:
            raise
        raise translated from exc


def _translated(exc: BaseException, what: str) -> GridError | None:
    """The ``meteor_spark.errors`` error for a Hazelcast client error raised doing ``what`` (None: not one)."""
    if isinstance(exc, GridError):
        return None
    if isinstance(exc, hz_errors.HazelcastError):
        if isinstance(exc, _CONNECTION_ERRORS):
            return GridConnectionError(f"{what}: the grid is unreachable ({exc})")
        code = getattr(exc, "error_code", None)
        return GridOperationError(f"{what}: {exc}", code=_code_of(exc) if code is None else code)
    if isinstance(exc, OSError):  # a dead socket
        return GridConnectionError(f"{what}: the grid is unreachable ({exc})")
    if isinstance(exc, AssertionError):  # the client validates arguments with AssertionError (check_true)
        return GridOperationError(f"{what}: {exc}")
    return None


def client_shut_down(error: BaseException) -> bool:
    """True when ``error`` (a translated one) says this client itself was shut down: nothing sent through it can
    succeed any more, so retrying is pointless."""
    return isinstance(error.__cause__, hz_errors.HazelcastClientNotActiveError)


def _code_of(exc: BaseException) -> int | None:
    for code, cls in hz_errors._ERROR_CODE_TO_ERROR.items():
        if type(exc) is cls:
            return code
    return None


def wait(future: Future[T], timeout_s: float | None) -> bool:
    """Wait for a Hazelcast future with a timeout (``Future.result()`` has none). True when it is done."""
    if future.done():
        return True
    done = threading.Event()
    future.add_done_callback(lambda _f: done.set())
    return done.wait(timeout_s)


def result(future: Future[T], what: str) -> T:
    """The future's value, with errors translated. A plain try (not ``translate_errors``' generator): it runs for
    every grid answer a publisher or a subscriber takes in, twice per one-record round trip."""
    try:
        return future.result()
    except (hz_errors.HazelcastError, OSError, AssertionError) as exc:
        translated = _translated(exc, what)
        if translated is None:
            raise
        raise translated from exc


@dataclass(frozen=True)
class ReadBatch:
    """What one ``read_many`` returned.

    Attributes:
        items: the ring items, in sequence order.
        sequences: the ring sequence of each item.
        next_sequence: the sequence to read from next.
    """

    items: Sequence[bytes]
    sequences: Sequence[int]
    next_sequence: int


class Ring:
    """A ring buffer of byte items (one lane of a stream)."""

    def __init__(self, proxy: Any, name: str) -> None:
        self._proxy = proxy
        self.name = name
        read_items_as_bytes(proxy)  # read items become bytes in one copy (meteor_spark.compat_ring)

    def capacity(self) -> int:
        return result(self._proxy.capacity(), f"capacity of ring {self.name!r}")

    def head(self) -> int:
        """Sequence of the oldest item still held (``tail + 1`` when empty)."""
        return result(self._proxy.head_sequence(), f"head of ring {self.name!r}")

    def head_async(self) -> Future[int]:
        """Start reading the head; the future's value is what ``head`` returns (errors untranslated: ``result``)."""
        return self._proxy.head_sequence()

    def tail(self) -> int:
        """Sequence of the newest item (-1 when nothing was ever added)."""
        return result(self._proxy.tail_sequence(), f"tail of ring {self.name!r}")

    def tail_async(self) -> Future[int]:
        """Start reading the tail; the future's value is what ``tail`` returns (errors untranslated: ``result``)."""
        return self._proxy.tail_sequence()

    def size(self) -> int:
        return result(self._proxy.size(), f"size of ring {self.name!r}")

    def add(self, item: bytes, overflow_policy: int = OVERWRITE) -> int:
        return result(self.add_async(item, overflow_policy), f"add to ring {self.name!r}")

    def add_async(self, item: bytes, overflow_policy: int = OVERWRITE) -> Future[int]:
        return self._proxy.add(bytearray(item), overflow_policy)

    def add_all(self, items: Sequence[bytes], overflow_policy: int = OVERWRITE) -> int:
        """Append items in order; returns the sequence of the last one (-1 if FAIL refused them)."""
        return result(self.add_all_async(items, overflow_policy), f"add_all to ring {self.name!r}")

    def add_all_async(self, items: Sequence[bytes], overflow_policy: int = OVERWRITE) -> Future[int]:
        """Start appending ``items``; the future's value is what ``add_all`` returns (errors untranslated: ``result``).
        Byte items are written once, straight into the request (``meteor_spark.compat_ring``)."""
        return ring_add_all_async(self._proxy, items, overflow_policy)

    def read_many_async(self, start: int, min_count: int, max_count: int) -> Future[Any]:
        """Start a read; the future's value is a hazelcast ReadResult. Use ``to_batch`` on it."""
        return self._proxy.read_many(start, min_count, min(max_count, MAX_BATCH_ITEMS))

    def read_batch_async(self, start: int, min_count: int, max_count: int) -> Future[ReadBatch]:
        """Start a read whose future's value is the ``ReadBatch`` itself, decoded on the client's reactor thread
        (``meteor_spark.compat_ring``: one future and one pass over the items instead of the public path's three
        futures, a ``ReadResult`` and ``to_batch``); what a subscriber's parked read per lane uses."""
        return ring_read_many_async(self._proxy, start, min_count, min(max_count, MAX_BATCH_ITEMS), ReadBatch)

    def read_views_async(self, start: int, min_count: int, max_count: int) -> Future[ReadBatch]:
        """``read_batch_async`` whose items are memoryviews of the answer's frames instead of ``bytes`` copied out of
        them: for a reader that decodes the items and lets them go (the Spark executor's)."""
        return ring_read_many_async(
            self._proxy, start, min_count, min(max_count, MAX_BATCH_ITEMS), ReadBatch, views=True
        )

    def read_many(self, start: int, min_count: int, max_count: int) -> ReadBatch:
        """Read up to ``max_count`` items from ``start`` (clamped by the grid to ``[head, tail + 1]``)."""
        future = self.read_many_async(start, min_count, max_count)
        return self.to_batch(result(future, f"read from ring {self.name!r} at sequence {start}"))

    @staticmethod
    def to_batch(read_result: Any) -> ReadBatch:
        items = list(read_result)
        sequences = [read_result.get_sequence(i) for i in range(len(items))]
        return ReadBatch(items, sequences, read_result.next_sequence_to_read_from)

    def destroy(self) -> None:
        with translate_errors(f"destroy ring {self.name!r}"):
            self._proxy.destroy()


def _why_not_connected(settings: GridSettings, failures: Sequence[BaseException]) -> str:
    """The reason a member gave when it refused us, else the usual suspects."""
    for failure in reversed(failures):
        if isinstance(failure, hz_errors.AuthenticationError):
            if settings.username is None:
                told = f"cluster name {settings.cluster_name!r} is not the cluster's name (or it requires credentials)"
            else:
                told = (
                    f"cluster name {settings.cluster_name!r} or username {settings.username!r} and its password do "
                    f"not match the member's (its log says which)"
                )
            return (
                f"the member refused the client's authentication: {told}; check hazelcast.clusterName / "
                f"--cluster-name and hazelcast.username / hazelcast.password"
            )
        if isinstance(failure, hz_errors.ClientNotAllowedInClusterError):
            return "the cluster does not allow this client in (its client filtering refused it)"
        if isinstance(failure, ssl.SSLError):
            return f"the TLS handshake failed: {failure}; check the hazelcast.ssl.* options against the members' TLS"
    return "is a member running there (`meteor grid start`), and are the cluster name and credentials right?"


def check_ring_config(pattern: str, capacity: int, backups: int, async_backups: int, ttl_s: int) -> None:
    """``ConfigError`` naming the argument of a ring buffer config that is out of range (both grid clients)."""
    if capacity < 1:
        raise ConfigError(f"ring config {pattern!r}: capacity must be >= 1, got {capacity}")
    if ttl_s < 0:
        raise ConfigError(f"ring config {pattern!r}: ttl_s must be >= 0 (0 = no expiry), got {ttl_s}")
    if backups < 0 or async_backups < 0 or backups + async_backups > 6:
        raise ConfigError(
            f"ring config {pattern!r}: backups ({backups}) and async_backups ({async_backups}) must be >= 0 "
            f"and at most 6 together"
        )


def require_grid(grid: object) -> Grid:
    """``grid`` if it is a ``Grid`` (or wraps one: an object with its ``ring`` and ``map``, as instrumentation and
    tests make), else ``ArgumentTypeError``: the first argument of publishers, subscribers and the admin tools is
    the connection (``Grid.connect(...)`` or ``Grid(GridSettings(...))``)."""
    if not isinstance(grid, Grid) and not all(callable(getattr(grid, name, None)) for name in ("ring", "map")):
        raise ArgumentTypeError(
            f"grid must be a connected meteor_spark Grid (Grid.connect('host:port') or Grid(GridSettings(...))), "
            f"got {type(grid).__name__} {grid!r}"
        )
    return cast(Grid, grid)


class GridMap:
    """A grid map with ``str`` keys and ``str`` values (JSON by convention, compared byte-wise by the grid)."""

    def __init__(self, proxy: Any, name: str) -> None:
        self._proxy = proxy
        self.name = name

    def _call(self, what: str, future: Future[T]) -> T:
        return result(future, f"{what} on map {self.name!r}")

    def get(self, key: str) -> str | None:
        return self._call("get", self._proxy.get(key))

    def get_all(self, keys: Sequence[str]) -> dict[str, str]:
        return self._call("get_all", self._proxy.get_all(list(keys))) if keys else {}

    def put(self, key: str, value: str, ttl_s: float | None = None) -> str | None:
        return self._call("put", self._proxy.put(key, value, ttl_s))

    def set(self, key: str, value: str, ttl_s: float | None = None) -> None:
        self._call("set", self._proxy.set(key, value, ttl_s))

    def put_if_absent(self, key: str, value: str, ttl_s: float | None = None) -> str | None:
        """Store unless present; returns the existing value, or None when this call stored it."""
        return self._call("put_if_absent", self._proxy.put_if_absent(key, value, ttl_s))

    def replace_if_same(self, key: str, old: str, new: str) -> bool:
        """Compare-and-set: replace only when the current value equals ``old`` byte for byte."""
        return self._call("replace_if_same", self._proxy.replace_if_same(key, old, new))

    def put_if_absent_async(self, key: str, value: str, ttl_s: float | None = None) -> Future[str | None]:
        """Start a ``put_if_absent``; the future's value is what it returns (errors untranslated: ``result``)."""
        return self._proxy.put_if_absent(key, value, ttl_s)

    def replace_if_same_async(self, key: str, old: str, new: str) -> Future[bool]:
        """Start a ``replace_if_same`` (errors untranslated: ``result``)."""
        return self._proxy.replace_if_same(key, old, new)

    def remove_if_same_async(self, key: str, value: str) -> Future[bool]:
        """Start a ``remove_if_same`` (errors untranslated: ``result``)."""
        return self._proxy.remove_if_same(key, value)

    def set_ttl_async(self, key: str, ttl_s: float) -> Future[None]:
        """Start a ``set_ttl`` (errors untranslated: ``result``)."""
        return self._proxy.set_ttl(key, ttl_s)

    def remove(self, key: str) -> str | None:
        return self._call("remove", self._proxy.remove(key))

    def remove_if_same(self, key: str, value: str) -> bool:
        return self._call("remove_if_same", self._proxy.remove_if_same(key, value))

    def delete(self, key: str) -> None:
        self._call("delete", self._proxy.delete(key))

    def entries(self) -> dict[str, str]:
        return dict(self._call("entry_set", self._proxy.entry_set()))

    def keys(self) -> list[str]:
        return list(self._call("key_set", self._proxy.key_set()))

    def size(self) -> int:
        return self._call("size", self._proxy.size())

    def set_ttl(self, key: str, ttl_s: float) -> None:
        self._call("set_ttl", self._proxy.set_ttl(key, ttl_s))

    def clear(self) -> None:
        self._call("clear", self._proxy.clear())

    def add_listener(self, on_change: Callable[[str], None]) -> str:
        """Call ``on_change(key)`` on every add/update/remove/expiry; returns the registration id."""

        def handler(event: Any) -> None:
            on_change(event.key)

        return self._call(
            "add_entry_listener",
            self._proxy.add_entry_listener(
                include_value=False,
                added_func=handler,
                updated_func=handler,
                removed_func=handler,
                expired_func=handler,
                evicted_func=handler,
            ),
        )

    def remove_listener(self, registration_id: str) -> None:
        self._call("remove_entry_listener", self._proxy.remove_entry_listener(registration_id))


class Grid:
    """A connection to a Hazelcast cluster (embedded or real).

    Examples:
        >>> grid = Grid.connect("10.0.0.5:5701", cluster_name="prod")   # doctest: +SKIP
        >>> grid = Grid.embedded()       # starts an embedded member on an ephemeral port  # doctest: +SKIP
        >>> grid = Grid.local()          # 127.0.0.1:5701, the default  # doctest: +SKIP
    """

    def __init__(
        self, settings: GridSettings, owned_server: Any = None, *, receive_buffer_bytes: int | None = None
    ) -> None:
        """``receive_buffer_bytes``: the connections' socket receive buffer, and the most the client reads from one
        in a call (the client's ``SO_RCVBUF`` socket option; None: its default, 128,000 bytes): a client that
        reads megabytes a second (the Spark executors') spends less of the kernel's time per byte with a larger
        one, a client of small messages has no use for it."""
        self.settings = settings
        self._owned_server = owned_server
        self._lock = threading.Lock()
        self._rings: dict[str, Ring] = {}
        self._maps: dict[str, GridMap] = {}
        tune_allocator()  # large records: freed buffers reused, not unmapped (meteor_spark.allocator)
        logger.info("connecting to Hazelcast cluster %r at %s", settings.cluster_name, ",".join(settings.members))
        try:
            check_tls_files(settings)
            with connect_failures() as failures:
                config = settings.client_config()
                if receive_buffer_bytes is not None:
                    config["socket_options"] = [(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)]
                self.client = hazelcast.HazelcastClient(**config)
        except hz_errors.IllegalStateError as exc:
            if owned_server is not None:
                owned_server.stop()
            raise GridConnectionError(
                f"could not connect to cluster {settings.cluster_name!r} at {', '.join(settings.members)} within "
                f"{settings.connect_timeout_s:g} s: {_why_not_connected(settings, failures)}"
            ) from exc
        except ConfigError:
            if owned_server is not None:
                owned_server.stop()
            raise
        self._connection_losses = 0
        self._losses_lock = threading.Lock()  # apart from _lock: taken on the reactor thread, never held over a call
        self.client.lifecycle_service.add_listener(self._on_lifecycle)
        on_connection_closed(self.client, self._lost_a_connection)

    @property
    def connection_losses(self) -> int:
        """How often a connection to a member was lost since connecting (a member died, restarted or was cut off).

        The client reconnects and retries reads on its own, so a reader would not notice that the member it reads
        from restarted, perhaps with a ring that lost its tail (``meteor_spark.grid.item_marks``). A reader that sees
        this count change checks its lanes against what it read before going on (``Subscriber``). It rises before the
        client can retry anything on a new connection (the lifecycle's ``DISCONNECTED`` and the connection
        listener fire first), so a read answered after a restart is always answered after the count changed.
        """
        return self._connection_losses

    def _lost_a_connection(self) -> None:
        with self._losses_lock:
            self._connection_losses += 1

    def _on_lifecycle(self, state: str) -> None:
        if state == "DISCONNECTED":
            self._lost_a_connection()

    @classmethod
    def connect(cls, members: str | Sequence[str] = DEFAULT_ADDRESS, **settings: Any) -> Grid:
        """Connect to a cluster. ``members`` is ``host:port``, a comma-separated list of them
        (``"10.0.0.5:5701,10.0.0.6:5701"``) or a sequence; other keyword arguments are ``GridSettings`` fields
        (``cluster_name``, ``username``, ``password``, ``ssl_*``, timeouts)."""
        return cls(GridSettings(members=split_members(members), **settings))

    @classmethod
    def local(cls, **settings: Any) -> Grid:
        """Connect to the grid on this machine, 127.0.0.1:5701."""
        return cls.connect(DEFAULT_ADDRESS, **settings)

    @classmethod
    def embedded(cls, **server_options: Any) -> Grid:
        """Start an embedded member owned by this Grid (stopped on ``close()``) and connect to it.

        ``server_options`` go to ``meteor_spark.server.EmbeddedGrid`` (port 0 = ephemeral by default).
        """
        from meteor_spark.server import EmbeddedGrid  # a client needs the embedded member only here

        server = EmbeddedGrid(**server_options)
        server.start()
        settings = GridSettings(
            members=(server.address,),
            cluster_name=server.cluster_name,
            username=server_options.get("username"),
            password=server_options.get("password"),
        )
        return cls(settings, owned_server=server)

    @property
    def address(self) -> str:
        return self.settings.members[0]

    def ring(self, name: str) -> Ring:
        with self._lock:
            ring = self._rings.get(name)
            if ring is None:
                with translate_errors(f"open ring {name!r}"):
                    ring = Ring(self.client.get_ringbuffer(name), name)
                self._rings[name] = ring
            return ring

    def map(self, name: str) -> GridMap:
        with self._lock:
            grid_map = self._maps.get(name)
            if grid_map is None:
                with translate_errors(f"open map {name!r}"):
                    grid_map = GridMap(self.client.get_map(name), name)
                self._maps[name] = grid_map
            return grid_map

    def flake_id(self, name: str) -> int:
        """A cluster-wide unique id (FlakeIdGenerator)."""
        with translate_errors(f"new id from {name!r}"):
            return self.client.get_flake_id_generator(name).blocking().new_id()

    def add_ring_config(
        self, pattern: str, capacity: int, backups: int = 1, async_backups: int = 0, ttl_s: int = 0
    ) -> None:
        """Add a ring buffer config to the running cluster (Hazelcast's dynamic configuration).

        ``pattern`` is an exact ring name or a pattern with one ``*`` wildcard (``meteor.stream::orders.*``). Rings
        created afterwards get this capacity/backups/TTL; existing rings keep theirs. Adding the same config again
        is fine.

        Raises:
            ConfigError: an argument is out of range.
            GridOperationError: the cluster has a different config under that name (Hazelcast code 32,
                InvalidConfiguration), or refuses dynamic configuration.
        """
        check_ring_config(pattern, capacity, backups, async_backups, ttl_s)
        request = add_ringbuffer_config_request(pattern, capacity, backups, async_backups, ttl_s)
        with translate_errors(f"add ring buffer config {pattern!r}"):
            invoke(self.client, request)

    def members(self) -> list[tuple[str, str, str]]:
        """(``host:port``, uuid, ``major.minor.patch``) of every cluster member this client knows (tools)."""
        with translate_errors("list cluster members"):
            found = self.client.cluster_service.get_members()
        return [
            (
                f"{m.address.host}:{m.address.port}",
                str(m.uuid),
                f"{m.version.major}.{m.version.minor}.{m.version.patch}" if m.version is not None else "?",
            )
            for m in found
        ]

    def distributed_objects(self) -> list[tuple[str, str]]:
        """(service name, object name) of every distributed object in the cluster."""
        with translate_errors("list distributed objects"):
            return [(o.service_name, o.name) for o in self.client.get_distributed_objects()]

    def close(self) -> None:
        with translate_errors("shutdown client"):
            self.client.shutdown()
        if self._owned_server is not None:
            self._owned_server.stop()
            self._owned_server = None

    def __enter__(self) -> Grid:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
