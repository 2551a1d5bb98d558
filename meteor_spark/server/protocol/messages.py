"""The message table: client/cluster, ring buffer and dynamic-config messages the member serves.

Parameters are listed in the order of ``hazelcast-client-protocol/protocol-definitions/<Service>.yaml``, named like
the arguments of the official Python client's codecs (single response values are named ``response``, as there).
The hex id of each request is written beside it, as in Hazelcast's own codecs. Map, lock, AtomicLong, FlakeId and
Topic messages live in ``messages_data.py``.
"""

from __future__ import annotations

from meteor_spark.server.protocol.codecs import (
    BOOLEAN,
    BYTE,
    BYTE_ARRAY,
    DATA,
    ENTRY_LIST_UUID_LIST_INTEGER,
    INT,
    LONG,
    LONG_ARRAY,
    SET_UUID,
    STRING,
    UUID,
    list_of,
    nullable,
    p,
)
from meteor_spark.server.protocol.message_codec import MessageSpec, event, message
from meteor_spark.server.protocol.structs import (
    ADDRESS,
    DISTRIBUTED_OBJECT_INFO,
    MEMBER_INFO,
    RINGBUFFER_STORE_CONFIG_HOLDER,
    SCHEMA,
)

# ---------------------------------------------------------------------------------------------------- Client (0x00)

_AUTH_RESPONSE = (
    p("status", BYTE),
    p("address", nullable(ADDRESS)),
    p("member_uuid", UUID),
    p("serialization_version", BYTE),
    p("server_hazelcast_version", STRING),
    p("partition_count", INT),
    p("cluster_id", UUID),
    p("failover_supported", BOOLEAN),
)

#: Who the client is: the parameters both authentication messages end with.
_AUTH_CLIENT = (
    p("uuid", UUID),
    p("client_type", STRING),
    p("serialization_version", BYTE),
    p("client_hazelcast_version", STRING),
    p("client_name", STRING),
    p("labels", list_of(STRING)),
)

CLIENT_AUTHENTICATION = message(  # 0x000100
    "Client.authentication",
    0x000100,
    request=(
        p("cluster_name", STRING),
        p("username", nullable(STRING)),
        p("password", nullable(STRING)),
        *_AUTH_CLIENT,
    ),
    response=_AUTH_RESPONSE,
)

CLIENT_AUTHENTICATION_CUSTOM = message(  # 0x000200
    "Client.authenticationCustom",
    0x000200,
    request=(
        p("cluster_name", STRING),
        p("credentials", BYTE_ARRAY),
        *_AUTH_CLIENT,
    ),
    response=_AUTH_RESPONSE,
)

CLIENT_ADD_CLUSTER_VIEW_LISTENER = message(  # 0x000300
    "Client.addClusterViewListener",
    0x000300,
    events=(
        event("MembersView", 0x000302, (p("version", INT), p("member_infos", list_of(MEMBER_INFO)))),
        event("PartitionsView", 0x000303, (p("version", INT), p("partitions", ENTRY_LIST_UUID_LIST_INTEGER))),
    ),
)

CLIENT_CREATE_PROXY = message(  # 0x000400
    "Client.createProxy", 0x000400, request=(p("name", STRING), p("service_name", STRING))
)

CLIENT_DESTROY_PROXY = message(  # 0x000500
    "Client.destroyProxy", 0x000500, request=(p("name", STRING), p("service_name", STRING))
)

CLIENT_GET_DISTRIBUTED_OBJECTS = message(  # 0x000800
    "Client.getDistributedObjects", 0x000800, response=(p("response", list_of(DISTRIBUTED_OBJECT_INFO)),)
)

CLIENT_ADD_DISTRIBUTED_OBJECT_LISTENER = message(  # 0x000900
    "Client.addDistributedObjectListener",
    0x000900,
    request=(p("local_only", BOOLEAN),),
    response=(p("response", UUID),),
    events=(
        event(
            "DistributedObject",
            0x000902,
            (p("name", STRING), p("service_name", STRING), p("event_type", STRING), p("source", UUID)),
        ),
    ),
)

CLIENT_REMOVE_DISTRIBUTED_OBJECT_LISTENER = message(  # 0x000A00
    "Client.removeDistributedObjectListener",
    0x000A00,
    request=(p("registration_id", UUID),),
    response=(p("response", BOOLEAN),),
)

CLIENT_PING = message("Client.ping", 0x000B00)  # 0x000B00

CLIENT_STATISTICS = message(  # 0x000C00
    "Client.statistics",
    0x000C00,
    request=(p("timestamp", LONG), p("client_attributes", STRING), p("metrics_blob", BYTE_ARRAY)),
)

CLIENT_LOCAL_BACKUP_LISTENER = message(  # 0x000F00
    "Client.localBackupListener",
    0x000F00,
    response=(p("response", UUID),),
    events=(event("Backup", 0x000F02, (p("source_invocation_correlation_id", LONG),)),),
)

CLIENT_SEND_SCHEMA = message(  # 0x001300
    "Client.sendSchema", 0x001300, request=(p("schema", SCHEMA),), response=(p("response", SET_UUID),)
)

CLIENT_FETCH_SCHEMA = message(  # 0x001400
    "Client.fetchSchema", 0x001400, request=(p("schema_id", LONG),), response=(p("response", nullable(SCHEMA)),)
)

CLIENT_SEND_ALL_SCHEMAS = message(  # 0x001500
    "Client.sendAllSchemas", 0x001500, request=(p("schemas", list_of(SCHEMA)),)
)

# ------------------------------------------------------------------------------------------------ Ringbuffer (0x17)

RINGBUFFER_SIZE = message(  # 0x170100
    "Ringbuffer.size", 0x170100, request=(p("name", STRING),), response=(p("response", LONG),)
)
RINGBUFFER_TAIL_SEQUENCE = message(  # 0x170200
    "Ringbuffer.tailSequence", 0x170200, request=(p("name", STRING),), response=(p("response", LONG),)
)
RINGBUFFER_HEAD_SEQUENCE = message(  # 0x170300
    "Ringbuffer.headSequence", 0x170300, request=(p("name", STRING),), response=(p("response", LONG),)
)
RINGBUFFER_CAPACITY = message(  # 0x170400
    "Ringbuffer.capacity", 0x170400, request=(p("name", STRING),), response=(p("response", LONG),)
)
RINGBUFFER_REMAINING_CAPACITY = message(  # 0x170500
    "Ringbuffer.remainingCapacity", 0x170500, request=(p("name", STRING),), response=(p("response", LONG),)
)
RINGBUFFER_ADD = message(  # 0x170600
    "Ringbuffer.add",
    0x170600,
    request=(p("name", STRING), p("overflow_policy", INT), p("value", DATA)),
    response=(p("response", LONG),),
)
RINGBUFFER_READ_ONE = message(  # 0x170700
    "Ringbuffer.readOne",
    0x170700,
    request=(p("name", STRING), p("sequence", LONG)),
    response=(p("response", nullable(DATA)),),
)
RINGBUFFER_ADD_ALL = message(  # 0x170800
    "Ringbuffer.addAll",
    0x170800,
    request=(p("name", STRING), p("value_list", list_of(DATA)), p("overflow_policy", INT)),
    response=(p("response", LONG),),
)
RINGBUFFER_READ_MANY = message(  # 0x170900
    "Ringbuffer.readMany",
    0x170900,
    request=(
        p("name", STRING),
        p("start_sequence", LONG),
        p("min_count", INT),
        p("max_count", INT),
        p("filter", nullable(DATA)),
    ),
    response=(
        p("read_count", INT),
        p("items", list_of(DATA)),
        p("item_seqs", nullable(LONG_ARRAY)),
        p("next_seq", LONG),
    ),
)

# --------------------------------------------------------------------------------------------- DynamicConfig (0x1B)

DYNAMIC_CONFIG_ADD_RINGBUFFER_CONFIG = message(  # 0x1B0200
    "DynamicConfig.addRingbufferConfig",
    0x1B0200,
    request=(
        p("name", STRING),
        p("capacity", INT),
        p("backup_count", INT),
        p("async_backup_count", INT),
        p("time_to_live_seconds", INT),
        p("in_memory_format", STRING),
        p("ringbuffer_store_config", nullable(RINGBUFFER_STORE_CONFIG_HOLDER)),
        p("split_brain_protection_name", nullable(STRING)),
        p("merge_policy", STRING),
        p("merge_batch_size", INT),
        # Added in protocol 2.7 (Hazelcast 5.4, user code namespaces); older clients do not send it.
        p("user_code_namespace", nullable(STRING), optional=True),
    ),
)

#: Every spec of this module, for the registry and the generated documentation.
ALL: tuple[MessageSpec, ...] = tuple(value for value in list(globals().values()) if isinstance(value, MessageSpec))
