"""Ring buffers with Hazelcast's ``ArrayRingbuffer`` / ``RingbufferContainer`` semantics, socket-free.

- Sequences: an empty ring has ``tail = -1`` and ``head = 0``; ``add`` makes ``tail += 1`` and, once the ring is
  full, moves ``head`` (overwriting the oldest item). Sequences never repeat until the ring is destroyed.
- Overflow: ``FAIL`` returns ``-1`` when ``remaining_capacity`` is too small; ``remaining_capacity`` is ``capacity``
  when the TTL is 0, so with no TTL ``FAIL`` never fails (it overwrites), exactly like Hazelcast.
- TTL: every item expires ``ttl`` after it was written; expired items are dropped from the head before every
  operation (time comes from the engine clock).
- Reads never block here: ``read_one`` returns ``WOULD_BLOCK`` and ``read_many`` reports "not done"; the handler
  parks on the ring's waiter key ``("ring", name)``, which every mutation notifies.
- Persistence seam: a ring may carry a ``store`` (``RingStore``) that sees every appended item, serves reads below
  the head (history beyond capacity, like Hazelcast's RingbufferStore) and restores the ring at creation.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from meteor_spark.server.engine.configs import NamedConfigs, check_pattern
from meteor_spark.server.engine.functions import refuse_java_function
from meteor_spark.server.errors import (
    DistributedObjectDestroyed,
    IllegalArgument,
    InvalidConfiguration,
    ServerError,
    StaleSequence,
)

logger = logging.getLogger(__name__)

OVERWRITE = 0
FAIL = 1

#: Hazelcast's limit on items per read_many / add_all call.
MAX_BATCH_SIZE = 1000

SERVICE_NAME = "hz:impl:ringbufferService"


class _WouldBlock:
    def __repr__(self) -> str:
        return "WOULD_BLOCK"


#: Returned by ``read_one`` when the sequence is not written yet: park on the ring's waiter key and retry.
WOULD_BLOCK = _WouldBlock()


# --------------------------------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class RingConfig:
    """A ring buffer configuration; ``name`` is an exact name or a pattern with one ``*`` wildcard.

    Defaults are Hazelcast's ``RingbufferConfig`` defaults.
    """

    name: str = "default"
    capacity: int = 10_000
    backup_count: int = 1
    async_backup_count: int = 0
    ttl_s: int = 0
    in_memory_format: str = "BINARY"
    merge_policy: str = "com.hazelcast.spi.merge.PutIfAbsentMergePolicy"
    merge_batch_size: int = 100
    split_brain_protection_name: str | None = None
    user_code_namespace: str | None = None
    """The last four change nothing on one member, but are part of a config's identity on Hazelcast: adding a
    config that differs in them only is a conflict there too."""

    def __post_init__(self) -> None:
        check_pattern("ring buffer", self.name)
        if self.capacity < 1:
            raise InvalidConfiguration(f"ring buffer config {self.name!r}: capacity must be >= 1, got {self.capacity}")
        if self.ttl_s < 0:
            raise InvalidConfiguration(
                f"ring buffer config {self.name!r}: timeToLiveSeconds must be >= 0, got {self.ttl_s}"
            )
        if not 0 <= self.backup_count <= 6 or not 0 <= self.async_backup_count <= 6:
            raise InvalidConfiguration(
                f"ring buffer config {self.name!r}: backup counts must be 0..6, got {self.backup_count} sync and "
                f"{self.async_backup_count} async"
            )
        if self.backup_count + self.async_backup_count > 6:
            raise InvalidConfiguration(
                f"ring buffer config {self.name!r}: at most 6 backups in total, got "
                f"{self.backup_count} + {self.async_backup_count}"
            )
        if self.in_memory_format not in ("BINARY", "OBJECT"):
            raise InvalidConfiguration(
                f"ring buffer config {self.name!r}: inMemoryFormat must be BINARY or OBJECT, "
                f"got {self.in_memory_format!r}"
            )

    def describe(self) -> str:
        """Hazelcast's ``RingbufferConfig.toString()``, which its conflict messages show (without a store: the
        embedded member refuses a RingbufferStore)."""
        return (
            f"RingbufferConfig{{name='{self.name}', capacity={self.capacity}, backupCount={self.backup_count}, "
            f"asyncBackupCount={self.async_backup_count}, timeToLiveSeconds={self.ttl_s}, "
            f"inMemoryFormat={self.in_memory_format}, ringbufferStoreConfig=RingbufferStoreConfig{{enabled=false, "
            f"className='null', storeImplementation=null, factoryClassName='null', factoryImplementation=null, "
            f"properties={{}}}}, splitBrainProtectionName={_java(self.split_brain_protection_name)}, "
            f"mergePolicyConfig=MergePolicyConfig{{policy='{self.merge_policy}', batchSize={self.merge_batch_size}}}, "
            f"userCodeNamespace={_java(self.user_code_namespace)}}}"
        )


def _java(text: str | None) -> str:
    """A nullable string as Java's string concatenation shows it."""
    return "null" if text is None else text


class RingConfigs(NamedConfigs[RingConfig]):
    """Per-name ring configs (static ones from the member's start-up, dynamic ones added by clients)."""

    def __init__(self, configs: Iterable[RingConfig] = ()) -> None:
        super().__init__(RingConfig(), configs)


# --------------------------------------------------------------------------------------------------------------------
# Persistence seam


class RingStore(Protocol):
    """What a ring needs from persistence (implemented in ``engine/ring_store.py``).

    ``append`` is called synchronously inside the mutation, in sequence order; the handler awaits ``commit()`` before
    it acknowledges the write (fsync policy ``always`` makes that a group-committed fsync).
    """

    def append(self, sequence: int, item: bytes) -> None: ...

    async def commit(self) -> None: ...

    def load(self, sequence: int) -> bytes | None:
        """The item at ``sequence`` if the store still has it (used for reads below the ring's head)."""

    def next_stored(self, sequence: int, below: int) -> int | None:
        """The first sequence in ``[sequence, below)`` the store holds (past sequences lost to damage), or None."""

    def recover(self, capacity: int) -> tuple[int, list[bytes]]:
        """(tail sequence, the last ``<= capacity`` items ending at that tail), at ring creation; (-1, []) if new."""

    def destroy(self) -> None:
        """Delete the ring's stored data (the ring was destroyed)."""


RingStoreFactory = Callable[[str, RingConfig], "RingStore | None"]


# --------------------------------------------------------------------------------------------------------------------
# The ring


@dataclass
class ReadManyState:
    """A read_many in progress: Hazelcast keeps what it collected across wake-ups of a long poll."""

    sequence: int
    min_count: int
    max_count: int
    items: list[bytes] = field(default_factory=list)
    sequences: list[int] = field(default_factory=list)
    next_sequence: int = 0  # stays 0 when nothing was read: the Java result set's quirk, reproduced on purpose
    done: bool = False

    @property
    def read_count(self) -> int:
        return len(self.items)


class Ringbuffer:
    """One ring (Hazelcast ``RingbufferContainer`` + ``ArrayRingbuffer``)."""

    def __init__(
        self,
        name: str,
        config: RingConfig,
        now_ms: Callable[[], float],
        on_change: Callable[[], None] = lambda: None,
        store: RingStore | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.capacity = config.capacity
        self.ttl_ms = config.ttl_s * 1000
        self._now_ms = now_ms
        self._on_change = on_change
        self.store = store
        # The slot arrays grow to ``capacity`` as items arrive (a ring configured for millions of items costs
        # nothing until it holds them); once full, slot ``sequence % capacity`` is overwritten.
        self._items: list[bytes | None] = []
        self._expiry: list[float] | None = [] if self.ttl_ms else None
        self.head = 0
        self.tail = -1
        self.destroyed = False
        if store is not None:
            self._recover(store)

    def _recover(self, store: RingStore) -> None:
        tail, items = store.recover(self.capacity)
        items = items[-self.capacity :] if items else []
        self.tail = tail
        self.head = tail - len(items) + 1
        expiry = self._now_ms() + self.ttl_ms
        if tail >= 0:
            # Recovered rings get their full slot array so that slot ``sequence % capacity`` holds each item.
            self._items = [None] * self.capacity
            if self._expiry is not None:
                self._expiry = [0.0] * self.capacity
            for offset, item in enumerate(items):
                index = (self.head + offset) % self.capacity
                self._items[index] = item
                if self._expiry is not None:
                    self._expiry[index] = expiry
        logger.info("ring %r recovered: head %d, tail %d", self.name, self.head, self.tail)

    # ---------------------------------------------------------------------------------------------- queries

    def cleanup(self) -> None:
        """Drop expired items from the head (Hazelcast runs this before every ring operation)."""
        expiry = self._expiry
        if expiry is None or self.tail < self.head:
            return
        now = self._now_ms()
        capacity = self.capacity
        while self.head <= self.tail:
            index = self.head % capacity
            if expiry[index] > now:
                break
            self._items[index] = None
            self.head += 1

    def size(self) -> int:
        self.cleanup()
        return self.tail - self.head + 1

    def item_bytes(self) -> int:
        """Bytes of the items held in memory (a metrics figure: one pass over the ring)."""
        self.cleanup()
        return sum(len(item) for item in self._items if item is not None)

    def head_sequence(self) -> int:
        self.cleanup()
        return self.head

    def tail_sequence(self) -> int:
        self.cleanup()
        return self.tail

    def remaining_capacity(self) -> int:
        """``capacity - size`` with a TTL, else ``capacity`` (Hazelcast: without TTL nothing is ever "in the way")."""
        if self.ttl_ms:
            return self.capacity - self.size()
        return self.capacity

    # ---------------------------------------------------------------------------------------------- writes

    def add(self, item: bytes, overflow_policy: int = OVERWRITE) -> int:
        """Append ``item``; its sequence, or -1 when ``FAIL`` finds no room."""
        if overflow_policy != OVERWRITE:  # the publish path: no calls for the default policy on a ring without TTL
            self._check_policy(overflow_policy)
        if self._expiry is not None:
            self.cleanup()
        if overflow_policy == FAIL and self.remaining_capacity() < 1:
            return -1
        sequence = self._append(item)
        self._on_change()
        return sequence

    def add_all(self, items: Sequence[bytes], overflow_policy: int = OVERWRITE) -> int:
        """Append ``items`` in order; the last sequence (the tail when ``items`` is empty), or -1 when ``FAIL``
        finds less room than ``len(items)`` (then nothing is written)."""
        if overflow_policy != OVERWRITE:
            self._check_policy(overflow_policy)
        if self._expiry is not None:
            self.cleanup()
        if overflow_policy == FAIL and self.remaining_capacity() < len(items):
            return -1
        if self._expiry is None and self.store is None and 0 < len(items) <= self.capacity:
            sequence = self._place(items)
        else:
            sequence = self.tail
            for item in items:
                sequence = self._append(item)
        if items:
            self._on_change()
        return sequence

    def _place(self, items: Sequence[bytes]) -> int:
        """``_append`` of each item, for a ring without TTL or store, done with list operations instead of a call
        per item (the Spark writer's batches are ``add_all`` calls of ten items): the slots take the items, the head
        moves past what they overwrote. The last sequence."""
        slots = self._items
        capacity = self.capacity
        count = len(items)
        first = self.tail + 1
        last = self.tail + count
        if len(slots) + count <= capacity:  # still growing to capacity
            slots.extend(items)
        elif len(slots) == capacity:  # full: overwrite, in at most two runs of slots
            start = first % capacity
            split = min(count, capacity - start)
            slots[start : start + split] = items[:split]
            if split < count:
                slots[: count - split] = items[split:]
        else:  # reaches capacity within this call
            room = capacity - len(slots)
            slots.extend(items[:room])
            slots[: count - room] = items[room:]
        self.tail = last
        self.head = max(self.head, last - capacity + 1)
        return last

    def _append(self, item: bytes) -> int:
        self.tail += 1
        sequence = self.tail
        items = self._items
        expiry = self._expiry
        if len(items) < self.capacity:
            items.append(item)
            if expiry is not None:
                expiry.append(self._now_ms() + self.ttl_ms)
        else:
            index = sequence % self.capacity
            items[index] = item
            if expiry is not None:
                expiry[index] = self._now_ms() + self.ttl_ms
        if sequence - self.capacity == self.head:
            self.head += 1
        if self.store is not None:
            self.store.append(sequence, item)
        return sequence

    def destroy(self) -> None:
        """Mark the ring destroyed and let go of its items now, as a Hazelcast member frees a destroyed ring's memory.

        Something may still refer to this object after the service dropped it: a read parked on it until it is
        answered, or garbage only the cyclic collector frees, whose full collections are rare in a member that
        allocates large items and few objects. Measured when a parked read's wake-up was such a cycle (it is an
        object of its own now, ``registry._ParkedAnswer``): a member serving rounds of (write 100 MB, read it, delete
        the stream) kept every round's items until such a collection, +95 MB of RSS per round. Emptied here, such a
        reference holds an empty ring (head past tail), which every waiting read answers as destroyed
        (``RingService.check_not_destroyed``).
        """
        self.destroyed = True
        self._items = []
        if self._expiry is not None:
            self._expiry = []
        self.head = self.tail + 1

    @staticmethod
    def _check_policy(policy: int) -> None:
        if policy not in (OVERWRITE, FAIL):
            raise IllegalArgument(f"overflowPolicy {policy} is unknown; use 0 (OVERWRITE) or 1 (FAIL)")

    # ---------------------------------------------------------------------------------------------- reads

    def read_one(self, sequence: int) -> bytes | _WouldBlock:
        """The item at ``sequence``; ``WOULD_BLOCK`` for ``tail + 1`` (not written yet).

        Raises:
            IllegalArgument: ``sequence > tail + 1``.
            StaleSequence: ``sequence < head`` and no store holds it.
        """
        self.cleanup()
        if sequence > self.tail + 1:
            raise IllegalArgument(f"sequence:{sequence} is too large. The current tailSequence is:{self.tail}")
        if sequence < self.head:
            item = self.store.load(sequence) if self.store is not None and sequence >= 0 else None
            if item is not None:
                return item
            raise StaleSequence(
                f"sequence:{sequence} is too small and data store is disabled. The current headSequence is:"
                f"{self.head} tailSequence is:{self.tail}"
            )
        if sequence == self.tail + 1:
            return WOULD_BLOCK
        item = self._items[sequence % self.capacity]
        assert item is not None
        return item

    def read_many(self, state: ReadManyState) -> bool:
        """Read into ``state`` as Hazelcast's ``ReadManyOperation`` does; True when the call can be answered.

        The start sequence is clamped into ``[head, tail + 1]`` on every attempt (below head: to head, unless the
        store still has the items; above tail + 1: to tail + 1). With ``min_count == 0`` it never waits.
        """
        self.cleanup()
        sequence = state.sequence
        if sequence < self.head and self.store is not None:
            sequence, complete = self._read_history(state, sequence)
            if not complete:
                # A gap in the stored history: answer with what was read so the result stays contiguous.
                state.sequence = sequence
                state.done = True
                return True
        if sequence < self.head:
            sequence = self.head
        elif sequence > self.tail + 1:
            sequence = self.tail + 1
        count = min(state.max_count - len(state.items), self.tail - sequence + 1)
        if count > 0:
            self._copy(state, sequence, count)
            sequence += count
            state.next_sequence = sequence
        state.sequence = sequence
        state.done = state.min_count == 0 or len(state.items) >= state.min_count
        return state.done

    def _read_history(self, state: ReadManyState, sequence: int) -> tuple[int, bool]:
        """Read items below the head from the store, up to ``max_count``; (next sequence, False if it hit a gap
        after reading something).

        A read that starts in a gap (sequences the store never had, or lost to damage) starts at the next stored
        sequence, or at the head: the answer's first sequence then tells the client what is missing.
        """
        store = self.store
        assert store is not None
        while sequence < self.head and len(state.items) < state.max_count:
            item = store.load(sequence) if sequence >= 0 else None
            if item is None:
                if state.items:
                    return sequence, False
                following = store.next_stored(max(sequence, 0) + 1, self.head)
                if following is None:
                    return self.head, True  # nothing stored there: clamp to the head like a ring without a store
                sequence = following
                continue
            state.items.append(item)
            state.sequences.append(sequence)
            sequence += 1
            state.next_sequence = sequence
        return sequence, True

    def _copy(self, state: ReadManyState, sequence: int, count: int) -> None:
        capacity = self.capacity
        start = sequence % capacity
        stop = start + count
        items = self._items
        if stop <= capacity:
            state.items.extend(items[start:stop])  # type: ignore[arg-type]
        else:
            state.items.extend(items[start:])  # type: ignore[arg-type]
            state.items.extend(items[: stop - capacity])  # type: ignore[arg-type]
        state.sequences.extend(range(sequence, sequence + count))


def check_read_many_arguments(start_sequence: int, min_count: int, max_count: int) -> None:
    """Hazelcast's argument checks (the client checks too; a raw protocol client may not).

    Raises:
        IllegalArgument: naming the bad argument and the allowed range.
    """
    if start_sequence < 0:
        raise IllegalArgument(f"sequence can't be smaller than 0, got startSequence {start_sequence}")
    if min_count < 0:
        raise IllegalArgument(f"minCount can't be smaller than 0, got {min_count}")
    if max_count < min_count:
        raise IllegalArgument(
            f"maxCount should be equal or larger than minCount, got minCount {min_count} and maxCount {max_count}"
        )
    if max_count > MAX_BATCH_SIZE:
        raise IllegalArgument(f"maxCount can't be larger than {MAX_BATCH_SIZE}, got {max_count}")


# --------------------------------------------------------------------------------------------------------------------
# The service


def refuse_filter(data: bytes) -> ServerError:
    """The error ``read_many`` answers when given a filter (a Java ``IFunction``, which this member cannot run)."""
    return refuse_java_function(
        data,
        "read_many with a filter needs a Java IFunction, which this member cannot run; read without a filter and "
        "filter the items in the client",
    )


_SERVICE_IDENTITY = f"{id(DistributedObjectDestroyed) & 0xFFFFFFFF:x}"
"""Stands for the Java identity hash a member prints after ``RingbufferService@``: a number fixed per process."""


class RingService:
    """All rings of the member, created on first use with the config matching their name."""

    def __init__(
        self,
        now_ms: Callable[[], float],
        notify: Callable[[object], None],
        configs: RingConfigs | None = None,
        store_factory: RingStoreFactory | None = None,
    ) -> None:
        self._now_ms = now_ms
        self._notify = notify
        self.configs = configs if configs is not None else RingConfigs()
        self.store_factory = store_factory
        self.rings: dict[str, Ringbuffer] = {}

    @staticmethod
    def waiter_key(name: str) -> tuple[str, str]:
        return ("ring", name)

    def get(self, name: str) -> Ringbuffer:
        ring = self.rings.get(name)
        if ring is None:
            config = self.configs.find(name)
            key = self.waiter_key(name)
            notify = self._notify
            store = self.store_factory(name, config) if self.store_factory is not None else None
            # A partial, not a lambda: every add calls it, and it then costs one Python call (the notify) not two.
            ring = Ringbuffer(name, config, self._now_ms, on_change=functools.partial(notify, key), store=store)
            self.rings[name] = ring
        return ring

    def get_or_none(self, name: str) -> Ringbuffer | None:
        return self.rings.get(name)

    def destroy(self, name: str) -> bool:
        """Drop the ring (and its stored history); waiting readers are woken and fail with
        DistributedObjectDestroyed. The next use creates it again, empty."""
        ring = self.rings.pop(name, None)
        if ring is None:
            return False
        ring.destroy()
        if ring.store is not None:
            ring.store.destroy()
        self._notify(self.waiter_key(name))
        return True

    @staticmethod
    def check_not_destroyed(ring: Ringbuffer) -> None:
        """A call that waited on a ring destroyed meanwhile fails as on a Hazelcast member, whose message names the
        service object (``RingbufferService@<identity hash>``) and the ring."""
        if ring.destroyed:
            raise DistributedObjectDestroyed(
                f"DistributedObject[com.hazelcast.ringbuffer.impl.RingbufferService@{_SERVICE_IDENTITY} -> "
                f"{ring.name}] has been destroyed!"
            )
