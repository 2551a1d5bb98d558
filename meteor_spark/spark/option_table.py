"""The table of every ``format("meteor")`` option: name, where it applies, type, default and meaning.

One place documents every option; ``options`` derives the names each side accepts from it, and docs/spark.md renders it
(``options.describe_options()``). Kept apart from the parsing because it is documentation data, a third of the
options' text.
"""

from __future__ import annotations

from dataclasses import dataclass

from meteor_spark.format.corrupt import CORRUPT_MODES
from meteor_spark.grid.client import GridSettings
from meteor_spark.grid.item_gate import ISOLATIONS
from meteor_spark.grid.transactions import DEFAULT_TIMEOUT_MS, SWEEP_INTERVAL_S

DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000
DEFAULT_GROUP_LEASE_MS = 5000

#: Records a shared-group micro-batch acquires at most without maxRecordsPerTrigger.
DEFAULT_SHARED_RECORDS_PER_TRIGGER = 10_000


@dataclass(frozen=True)
class OptionDoc:
    """One row of the options table.

    Attributes:
        name: the option name as documented (Spark matches it case-insensitively).
        applies_to: ``read``, ``readStream``, ``read (batch)``, ``write``, ``writeStream`` or a combination.
        type: the value's type as a user writes it.
        default: the default, as text.
        meaning: what it does, in one or two sentences.
    """

    name: str
    applies_to: str
    type: str
    default: str
    meaning: str


def _grid_type(name: str) -> str:
    if name.endswith(("enabled", "checkHostname", "smartRouting")):
        return "bool"
    if name.endswith("Timeout"):
        return "seconds"
    if name.endswith("Bytes"):
        return "int (bytes)"
    return "string"


#: Every option of format("meteor"). The option table of docs/spark.md is generated from this tuple.
OPTION_TABLE: tuple[OptionDoc, ...] = (
    OptionDoc(
        "stream",
        "read, write",
        "string (comma list when reading)",
        "(required)",
        "Stream(s) to read, or the stream to write to when the rows have no `stream` column. "
        '`load("name")` / `save("name")` / `start("name")` set it too.',
    ),
    OptionDoc(
        "streamPattern",
        "read, readStream",
        "regular expression (Python)",
        "(none)",
        "Read every stream whose whole name matches (Kafka's subscribePattern; exclusive with `stream`). A "
        "streaming query lists the streams at every micro-batch: a stream created while it runs is read from "
        "its oldest item at the next batch; a deleted one is logged (WARNING) and drops out of the offsets, and "
        "if it still held items the query had not read (as far as the running query saw), that is data loss "
        "(failOnDataLoss). No matching stream yet: the query waits, running no batch. With `group`, each "
        "stream is read as that group. An AvailableNow run reads the streams that existed when it started. "
        "Planning reads the lanes that moved in the last 200 ms at every batch and the idle ones a budget at a "
        "time (4 x the square root of the lane count, at least 64), so a batch's cost grows with the square "
        "root of the streams matched: records published to a stream idle until then enter a batch within "
        "500 ms or ceil(lanes / budget) batches, whichever is longer (1,000 one-lane streams: 8 batches).",
    ),
    OptionDoc(
        "conf",
        "read, write",
        "path",
        "(none)",
        "A meteor TOML file (`[hazelcast]` section) read on the driver; `hazelcast.*` options override it.",
    ),
    OptionDoc(
        "startingOffsets",
        "read, readStream",
        "earliest | latest | group | JSON",
        "latest (stream), earliest (batch)",
        "Where a query without a checkpoint starts. `earliest` = oldest item each lane still holds; "
        "`latest` = after the newest; `group` = the group's confirmed offsets, failing for lanes that have "
        'none; JSON `{"stream": {"0": 42}}` = per-lane ring sequence (-2 earliest, -1 latest). With '
        "`group` set, lanes the group has confirmed start there whatever this option says.",
    ),
    OptionDoc(
        "endingOffsets",
        "read (batch)",
        "latest | JSON",
        "latest",
        "Where a batch read stops (exclusive): `latest` = the lane ends when the query is planned, or "
        "per-lane JSON like startingOffsets (-1 latest).",
    ),
    OptionDoc(
        "startingTimestamp",
        "read, readStream",
        "int >= 0 (ms since the epoch)",
        "(none)",
        "Start every lane of every stream at its first record whose timestamp is >= this time (Kafka's "
        "offsetsForTimes; found by a binary search over the lane's ring items, see "
        "`meteor_spark.grid.timestamps` for out-of-order timestamps). Records of that ring item before it are not "
        "read. A lane with no such record follows startingOffsetsByTimestampStrategy. Excludes "
        "startingOffsets and startingOffsetsByTimestamp (Kafka's source would silently prefer this one).",
    ),
    OptionDoc(
        "startingOffsetsByTimestamp",
        "read, readStream",
        "JSON",
        "(none)",
        'Per-lane start times `{"stream": {"0": 1700000000000}}` (ms since the epoch), every lane of '
        "every stream read; otherwise as startingTimestamp. Excludes startingOffsets.",
    ),
    OptionDoc(
        "startingOffsetsByTimestampStrategy",
        "read, readStream",
        "error | latest",
        "error",
        "A lane with no record at or after its start time: `error` = fail naming stream, lane and time "
        "(Kafka's default); `latest` = start that lane at its end (it reads only newer records). Needs "
        "startingTimestamp or startingOffsetsByTimestamp.",
    ),
    OptionDoc(
        "endingTimestamp",
        "read (batch)",
        "int >= 0 (ms since the epoch)",
        "(none)",
        "End every lane (exclusive) at its first record whose timestamp is >= this time; a lane with no "
        "such record ends at latest (as in Kafka). Excludes endingOffsets and endingOffsetsByTimestamp.",
    ),
    OptionDoc(
        "endingOffsetsByTimestamp",
        "read (batch)",
        "JSON",
        "(none)",
        "Per-lane end times, JSON like startingOffsetsByTimestamp; otherwise as endingTimestamp. Excludes "
        "endingOffsets.",
    ),
    OptionDoc(
        "maxOffsetsPerTrigger",
        "readStream",
        "int > 0 (ring items)",
        "(no limit)",
        "Most ring items one micro-batch reads, over all lanes, split in proportion to each lane's backlog "
        "(a lane with data gets at least 1, so a batch may hold up to one item per lane more). A ring item "
        "holds one publisher batch (up to the stream's max_batch_records records).",
    ),
    OptionDoc(
        "maxBytesPerTrigger",
        "readStream",
        "size (64m, 1g, 512k or bytes)",
        "(no limit)",
        "About the most bytes one micro-batch reads, over all lanes, split in proportion to each lane's "
        "backlog. The driver knows item counts, not sizes: it estimates each lane's item size from the items "
        "it samples (one read of one item per lane and batch, a running average), so a batch may exceed the "
        "cap by up to one item per lane, and a lane with data always admits at least one item. Honoured by "
        "Trigger.AvailableNow (several batches); with maxOffsetsPerTrigger the tighter limit wins; Trigger.Once "
        "reads everything, as with every limit.",
    ),
    OptionDoc(
        "maxBytesPerLanePerTrigger",
        "readStream",
        "size (64m, 1g, 512k or bytes)",
        "(no limit)",
        "About the most bytes one micro-batch reads from one lane (estimated like maxBytesPerTrigger; at least "
        "one item per lane with data).",
    ),
    OptionDoc(
        "minOffsetsPerTrigger",
        "readStream",
        "int > 0 (ring items)",
        "(none)",
        "Skip a trigger until at least this many ring items are waiting, or maxTriggerDelay passed. "
        "Ignored by Trigger.AvailableNow (it reads what was there when it started, then stops).",
    ),
    OptionDoc(
        "maxTriggerDelay",
        "readStream",
        "duration (15m, 30s, 500ms)",
        "15m",
        "Longest wait for minOffsetsPerTrigger before a smaller batch runs anyway.",
    ),
    OptionDoc(
        "minPartitions",
        "read, readStream",
        "int > 0",
        "(the driver's CPU count)",
        "Split lane ranges so a batch has at least this many Spark tasks. Given explicitly, ranges are split "
        "down to single ring items if needed; by default only into pieces of at least 64 items, so one "
        "busy lane uses every local core but small batches are not cut up. On a cluster, set it to the "
        "cores that read.",
    ),
    OptionDoc(
        "maxPartitions",
        "read, readStream",
        "int > 0",
        "(see meaning)",
        "Most Spark tasks per batch: lane ranges beyond it are grouped, a task reading its ranges one after "
        "another. Without it, ranges are grouped only while the batch has more tasks than minPartitions "
        "and than one per 4096 ring items (a Python task costs ~0.1 s to start, so many small ranges read "
        "faster together); large ranges keep one task each, like Kafka's.",
    ),
    OptionDoc(
        "maxOffsetsPerPartition",
        "read, readStream",
        "int > 0 (ring items)",
        "(no limit)",
        "Split a lane range into Spark tasks of at most this many ring items (Kafka's "
        "maxRecordsPerPartition, counted in ring items).",
    ),
    OptionDoc(
        "failOnDataLoss",
        "read, readStream",
        "bool",
        "true",
        "Fail the query when the ring overwrote items it had not read yet (the error names stream, lane, "
        "requested and oldest available sequence). false = skip to the oldest available item, log and "
        "count the skipped items. The driver moves a lane that fell behind straight to its oldest "
        "available item and counts each lost item once per query, across restarts (the count rides in the "
        "checkpointed offsets); items overwritten while their batch is being read are skipped and logged by "
        "the task.",
    ),
    OptionDoc(
        "onCorrupt",
        "read, readStream",
        " | ".join(CORRUPT_MODES),
        "error (dead_letter with deadLetterStream)",
        "What a task does with a ring item that is not a valid record batch (damaged, a foreign writer's, a "
        "newer format). `error` = fail the query naming stream, lane and sequence; `skip` = leave it out, "
        "count and log it (executor log); `dead_letter` = publish the raw item to deadLetterStream and read "
        "on.",
    ),
    OptionDoc(
        "deadLetterStream",
        "read, readStream",
        "string (an existing stream)",
        "(none)",
        "Where refused items go (alone it implies onCorrupt=dead_letter): the raw item as the value of one "
        "record, with headers meteor.source.stream, .lane, .sequence, .offset and meteor.error. Published "
        "before the task hands on the rows after the item; a retried task may publish it again "
        "(at-least-once).",
    ),
    OptionDoc(
        "isolation",
        "read, readStream",
        " | ".join(ISOLATIONS),
        "read_uncommitted",
        "Kafka's kafka.isolation.level. `read_committed` = rows of a transactional sink's micro-batch only "
        "once its commit recorded them, never those of failed or superseded task attempts or aborted "
        "batches; a lane's batch ends at the first item of a transaction still open (its last stable "
        "offset) until it is decided (committed, aborted, or timed out). `read_uncommitted` = every record "
        "as stored. Both drop re-sent copies of a ring item (same producer id and sequence) within a task's "
        "range.",
    ),
    OptionDoc(
        "includeHeaders",
        "read, readStream",
        "bool",
        "false",
        "Add the `headers` column (array<struct<key: string, value: binary>>).",
    ),
    OptionDoc(
        "headersAsMap",
        "read, readStream",
        "bool",
        "false",
        "With includeHeaders: the `headers` column is map<string, binary> instead. A record with the same "
        "header key twice keeps the last value (Kafka's lastHeader); use the array form to see every value.",
    ),
    OptionDoc(
        "valueFormat",
        "read, readStream",
        "bytes | avro",
        "bytes",
        "`avro`: the `value` column is a struct typed from the stream's schema (its latest version, known when the "
        "query is defined; `meteor schemas register`), each record decoded with its own writer's version; a record "
        "that cannot be decoded goes through onCorrupt. One stream only. Writing needs no option: a struct `value` "
        "column is encoded with the target stream's latest schema.",
    ),
    OptionDoc(
        "valueSchemaVersion",
        "read, readStream",
        "int",
        "latest",
        "With valueFormat=avro: the schema version the `value` column is typed and decoded into (records of other "
        "versions are projected onto it by Avro's resolution rules).",
    ),
    OptionDoc(
        "keyLanes",
        "read (batch)",
        "bool",
        "true",
        "With filter pushdown (`spark.sql.python.filterPushdown.enabled`): a `key = k` / `key IN (...)` predicate "
        "plans only the keys' lanes (CRC-32 of the key, the publishers' routing). Set false for a stream whose "
        "publishers put keyed records in other lanes explicitly: every lane is read, rows still checked per key.",
    ),
    OptionDoc(
        "topics",
        "read, readStream",
        "string",
        "(none)",
        "Only rows whose topic matches one of these AMQP patterns, comma-separated (`*` one word, `#` zero or "
        "more: `orders.*.created,audit.#`); the others are passed over. On an ephemeral stream a streaming query "
        "is a consuming entity while its source runner runs (it registers these patterns, default `#`): "
        "publishers keep the records it matches; it starts at the lanes' ends and takes no `group`.",
    ),
    OptionDoc(
        "group",
        "readStream",
        "string",
        "(none)",
        "Read as this subscriber group: the query holds the group's lane leases (on the driver) and writes "
        "the group's confirmed offsets after each batch is committed. A second query in the group waits "
        "as standby and takes over when the first stops or dies.",
    ),
    OptionDoc(
        "groupLeaseMs",
        "readStream",
        "int > 0 (ms)",
        str(DEFAULT_GROUP_LEASE_MS),
        "Lease length of the group's lanes; a dead query's lanes pass to a standby after this long. Needs group.",
    ),
    OptionDoc(
        "groupMemberId",
        "readStream",
        "string",
        "(generated)",
        "Member id this query uses in the group (shown by `meteor groups`); unique per running query. Needs group.",
    ),
    OptionDoc(
        "shared",
        "readStream",
        "bool",
        "false",
        "Read as a member of the shared group `group` (queue semantics): each micro-batch acquires records "
        "(more tasks than lanes: minPartitions), they are acknowledged when the batch is committed, and redelivered "
        "with delivery_count + 1 when a batch never commits. Adds the delivery_count column. One stream; "
        "startingOffsets may only be group (the group's state decides).",
    ),
    OptionDoc(
        "maxRecordsPerTrigger",
        "readStream",
        "int > 0",
        str(DEFAULT_SHARED_RECORDS_PER_TRIGGER),
        "Most records one micro-batch acquires from a shared group. Needs shared=true.",
    ),
    OptionDoc(
        "acquisitionTimeoutMs",
        "readStream",
        "int > 0 (ms)",
        "(the group's; 30000 for a new group)",
        "The shared group's record lock duration: a batch must commit within it, or its records go to other "
        "members. A group setting: set by the group's first member, refused when it differs. Needs shared=true.",
    ),
    OptionDoc(
        "maxDeliveries",
        "readStream",
        "int > 0",
        "(the group's; 5 with a dead-letter stream)",
        "Deliveries after which a shared group's record is dead-lettered to deadLetterStream (the group's "
        "dead-letter stream with shared=true). A group setting. Needs shared=true and deadLetterStream.",
    ),
    OptionDoc(
        "sinkId",
        "writeStream",
        "string",
        "(the checkpoint location)",
        "Key under which committed micro-batch ids are recorded in the grid (map meteor.sink.commits) so "
        "that a batch Spark replays after it was committed is not published twice.",
    ),
    OptionDoc(
        "transactional",
        "write, writeStream",
        "bool",
        "true",
        "Publish each micro-batch (writeStream) or job (write) as one transaction: every task attempt under "
        "its own producer id, committed by one fenced write in the sink's commit with the attempts that "
        "succeeded. read_committed readers then see every row exactly once, even when tasks fail part-way or "
        "the driver dies and restarts; read_uncommitted readers also see the rows of failed attempts. "
        "false = plain items (at least once for a batch that fails part-way).",
    ),
    OptionDoc(
        "groupOffsets",
        "writeStream",
        "auto | true | false",
        "auto",
        "Commit the offsets of a grouped meteor source of the same query (option `group`, exclusive) in each "
        "micro-batch's transaction: records and the group's offsets move in one decision, so a restart from the "
        "group with a new checkpoint, or a standby query taking the group over, duplicates and loses nothing for "
        "read_committed readers; a batch whose lane another member took over is aborted and the query fails "
        "(FencedError). `auto` = when the batch read such a source; `true` = also fail a batch that published "
        "rows without one; `false` = the source confirms after the commit (at least once across checkpoints). "
        "Needs transactional=true (`auto` is `false` without it).",
    ),
    OptionDoc(
        "transactionTimeoutMs",
        "write, writeStream",
        "int > 0 (ms)",
        str(DEFAULT_TIMEOUT_MS),
        "A transaction still open this long after its last task attempt started is aborted by the first "
        "read_committed reader that meets it (a dead writer's rows never hold readers up for longer); its "
        "commit then fails and the query fails. Keep it above the longest batch. A restarted query aborts "
        "its previous run's open transaction of the replayed batch at once (fencing by sinkId and query "
        "id).",
    ),
    OptionDoc(
        "sweepIntervalMs",
        "write, writeStream",
        "int > 0 (ms)",
        str(int(SWEEP_INTERVAL_S * 1000)),
        "How often (at most) the sink's commit removes decided transactions no reader can still need from "
        "the transaction maps (meteor.txns, meteor.txn.producers, meteor.txn.batches). Shorter keeps the "
        "maps nearer their bound at the cost of one listing of them per interval.",
    ),
    OptionDoc(
        "createStream",
        "write, writeStream",
        "bool",
        "true",
        "Create the target stream (default configuration) when it does not exist; false = fail instead.",
    ),
    *(
        OptionDoc(name, "read, write", _grid_type(name), default, meaning)
        for name, default, meaning in GridSettings.OPTION_DOCS
    ),
)
