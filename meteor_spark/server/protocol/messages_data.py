"""The message table of the member's data structures: Map, Topic, FlakeIdGenerator, AtomicLong and CP groups.

Same conventions as ``messages.py``: parameters in the protocol definitions' declaration order (the wire order, fixed
parameters first, is derived by ``MessageSpec``), named like the arguments of the official Python client's codecs;
single response values are named ``response``. The table was transcribed mechanically from the 5.7 client codecs
and is checked against them by the round-trip tests (official encode -> our decode, our encode -> official decode).
"""

from __future__ import annotations

from meteor_spark.server.protocol.codecs import BOOLEAN, DATA, INT, LONG, STRING, UUID, entry_list, list_of, nullable, p
from meteor_spark.server.protocol.message_codec import MessageSpec, event, message
from meteor_spark.server.protocol.structs import RAFT_GROUP_ID, SIMPLE_ENTRY_VIEW

_NAME = p("name", STRING)
#: Key-based map operations: the key, and the client thread that may own the key's lock.
_KEYED = (_NAME, p("key", DATA), p("thread_id", LONG))
#: Writes of a value with a TTL (milliseconds; -1: the map config's default).
_PUT = (_NAME, p("key", DATA), p("value", DATA), p("thread_id", LONG), p("ttl", LONG))
_MAX_IDLE = p("max_idle", LONG)
#: An AtomicLong operation names its CP group and its object.
_CP_OBJECT = (p("group_id", RAFT_GROUP_ID), _NAME)
_DATA_RESPONSE = (p("response", nullable(DATA)),)
_BOOLEAN_RESPONSE = (p("response", BOOLEAN),)
_LONG_RESPONSE = (p("response", LONG),)

#: The Entry event of every map entry-listener message (Map.yaml declares the same parameters for each).
_ENTRY_EVENT = (
    p("key", nullable(DATA)),
    p("value", nullable(DATA)),
    p("old_value", nullable(DATA)),
    p("merging_value", nullable(DATA)),
    p("event_type", INT),
    p("uuid", UUID),
    p("number_of_affected_entries", INT),
)

ATOMIC_LONG_ADD_AND_GET = message(  # 0x090300
    "AtomicLong.addAndGet",
    0x090300,
    request=(*_CP_OBJECT, p("delta", LONG)),
    response=_LONG_RESPONSE,
)
ATOMIC_LONG_ALTER = message(  # 0x090200
    "AtomicLong.alter",
    0x090200,
    request=(*_CP_OBJECT, p("function", DATA), p("return_value_type", INT)),
    response=_LONG_RESPONSE,
)
ATOMIC_LONG_APPLY = message(  # 0x090100
    "AtomicLong.apply",
    0x090100,
    request=(*_CP_OBJECT, p("function", DATA)),
    response=_DATA_RESPONSE,
)
ATOMIC_LONG_COMPARE_AND_SET = message(  # 0x090400
    "AtomicLong.compareAndSet",
    0x090400,
    request=(*_CP_OBJECT, p("expected", LONG), p("updated", LONG)),
    response=_BOOLEAN_RESPONSE,
)
ATOMIC_LONG_GET_AND_ADD = message(  # 0x090600
    "AtomicLong.getAndAdd",
    0x090600,
    request=(*_CP_OBJECT, p("delta", LONG)),
    response=_LONG_RESPONSE,
)
ATOMIC_LONG_GET_AND_SET = message(  # 0x090700
    "AtomicLong.getAndSet",
    0x090700,
    request=(*_CP_OBJECT, p("new_value", LONG)),
    response=_LONG_RESPONSE,
)
ATOMIC_LONG_GET = message(  # 0x090500
    "AtomicLong.get",
    0x090500,
    request=_CP_OBJECT,
    response=_LONG_RESPONSE,
)
CP_GROUP_CREATE_CP_GROUP = message(  # 0x1E0100
    "CPGroup.createCPGroup",
    0x1E0100,
    request=(p("proxy_name", STRING),),
    response=(p("response", RAFT_GROUP_ID),),
)
CP_GROUP_DESTROY_CP_OBJECT = message(  # 0x1E0200
    "CPGroup.destroyCPObject",
    0x1E0200,
    request=(p("group_id", RAFT_GROUP_ID), p("service_name", STRING), p("object_name", STRING)),
)
FLAKE_ID_GENERATOR_NEW_ID_BATCH = message(  # 0x1C0100
    "FlakeIdGenerator.newIdBatch",
    0x1C0100,
    request=(_NAME, p("batch_size", INT)),
    response=(p("base", LONG), p("increment", LONG), p("batch_size", INT)),
)
MAP_ADD_ENTRY_LISTENER = message(  # 0x011900
    "Map.addEntryListener",
    0x011900,
    request=(_NAME, p("include_value", BOOLEAN), p("listener_flags", INT), p("local_only", BOOLEAN)),
    response=(p("response", UUID),),
    events=(event("Entry", 0x011902, _ENTRY_EVENT),),
)
MAP_ADD_ENTRY_LISTENER_TO_KEY = message(  # 0x011800
    "Map.addEntryListenerToKey",
    0x011800,
    request=(_NAME, p("key", DATA), p("include_value", BOOLEAN), p("listener_flags", INT), p("local_only", BOOLEAN)),
    response=(p("response", UUID),),
    events=(event("Entry", 0x011802, _ENTRY_EVENT),),
)
MAP_CLEAR = message(  # 0x012D00
    "Map.clear",
    0x012D00,
    request=(_NAME,),
)
MAP_CONTAINS_KEY = message(  # 0x010600
    "Map.containsKey",
    0x010600,
    request=_KEYED,
    response=_BOOLEAN_RESPONSE,
)
MAP_CONTAINS_VALUE = message(  # 0x010700
    "Map.containsValue",
    0x010700,
    request=(_NAME, p("value", DATA)),
    response=_BOOLEAN_RESPONSE,
)
MAP_DELETE = message(  # 0x010900
    "Map.delete",
    0x010900,
    request=_KEYED,
)
MAP_ENTRY_SET = message(  # 0x012500
    "Map.entrySet",
    0x012500,
    request=(_NAME,),
    response=(p("response", entry_list(DATA, DATA)),),
)
MAP_EVICT_ALL = message(  # 0x011F00
    "Map.evictAll",
    0x011F00,
    request=(_NAME,),
)
MAP_EVICT = message(  # 0x011E00
    "Map.evict",
    0x011E00,
    request=_KEYED,
    response=_BOOLEAN_RESPONSE,
)
MAP_FLUSH = message(  # 0x010A00
    "Map.flush",
    0x010A00,
    request=(_NAME,),
)
MAP_FORCE_UNLOCK = message(  # 0x013300
    "Map.forceUnlock",
    0x013300,
    request=(_NAME, p("key", DATA), p("reference_id", LONG)),
)
MAP_GET_ALL = message(  # 0x012300
    "Map.getAll",
    0x012300,
    request=(_NAME, p("keys", list_of(DATA))),
    response=(p("response", entry_list(DATA, DATA)),),
)
MAP_GET = message(  # 0x010200
    "Map.get",
    0x010200,
    request=_KEYED,
    response=_DATA_RESPONSE,
)
MAP_GET_ENTRY_VIEW = message(  # 0x011D00
    "Map.getEntryView",
    0x011D00,
    request=_KEYED,
    response=(p("response", nullable(SIMPLE_ENTRY_VIEW)), p("max_idle", LONG)),
)
MAP_IS_EMPTY = message(  # 0x012B00
    "Map.isEmpty",
    0x012B00,
    request=(_NAME,),
    response=_BOOLEAN_RESPONSE,
)
MAP_IS_LOCKED = message(  # 0x011200
    "Map.isLocked",
    0x011200,
    request=(_NAME, p("key", DATA)),
    response=_BOOLEAN_RESPONSE,
)
MAP_KEY_SET = message(  # 0x012200
    "Map.keySet",
    0x012200,
    request=(_NAME,),
    response=(p("response", list_of(DATA)),),
)
MAP_LOCK = message(  # 0x011000
    "Map.lock",
    0x011000,
    request=(*_KEYED, p("ttl", LONG), p("reference_id", LONG)),
)
MAP_PUT_ALL = message(  # 0x012C00
    "Map.putAll",
    0x012C00,
    request=(_NAME, p("entries", entry_list(DATA, DATA)), p("trigger_map_loader", BOOLEAN)),
)
MAP_PUT = message(  # 0x010100
    "Map.put",
    0x010100,
    request=_PUT,
    response=_DATA_RESPONSE,
)
MAP_PUT_IF_ABSENT = message(  # 0x010E00
    "Map.putIfAbsent",
    0x010E00,
    request=_PUT,
    response=_DATA_RESPONSE,
)
MAP_PUT_IF_ABSENT_WITH_MAX_IDLE = message(  # 0x014600
    "Map.putIfAbsentWithMaxIdle",
    0x014600,
    request=(*_PUT, _MAX_IDLE),
    response=_DATA_RESPONSE,
)
MAP_PUT_TRANSIENT = message(  # 0x010D00
    "Map.putTransient",
    0x010D00,
    request=_PUT,
)
MAP_PUT_TRANSIENT_WITH_MAX_IDLE = message(  # 0x014500
    "Map.putTransientWithMaxIdle",
    0x014500,
    request=(*_PUT, _MAX_IDLE),
    response=_DATA_RESPONSE,
)
MAP_PUT_WITH_MAX_IDLE = message(  # 0x014400
    "Map.putWithMaxIdle",
    0x014400,
    request=(*_PUT, _MAX_IDLE),
    response=_DATA_RESPONSE,
)
MAP_REMOVE = message(  # 0x010300
    "Map.remove",
    0x010300,
    request=_KEYED,
    response=_DATA_RESPONSE,
)
MAP_REMOVE_ENTRY_LISTENER = message(  # 0x011A00
    "Map.removeEntryListener",
    0x011A00,
    request=(_NAME, p("registration_id", UUID)),
    response=_BOOLEAN_RESPONSE,
)
MAP_REMOVE_IF_SAME = message(  # 0x010800
    "Map.removeIfSame",
    0x010800,
    request=(_NAME, p("key", DATA), p("value", DATA), p("thread_id", LONG)),
    response=_BOOLEAN_RESPONSE,
)
MAP_REPLACE = message(  # 0x010400
    "Map.replace",
    0x010400,
    request=(_NAME, p("key", DATA), p("value", DATA), p("thread_id", LONG)),
    response=_DATA_RESPONSE,
)
MAP_REPLACE_IF_SAME = message(  # 0x010500
    "Map.replaceIfSame",
    0x010500,
    request=(_NAME, p("key", DATA), p("test_value", DATA), p("value", DATA), p("thread_id", LONG)),
    response=_BOOLEAN_RESPONSE,
)
MAP_SET = message(  # 0x010F00
    "Map.set",
    0x010F00,
    request=_PUT,
)
MAP_SET_TTL = message(  # 0x014300
    "Map.setTtl",
    0x014300,
    request=(_NAME, p("key", DATA), p("ttl", LONG)),
    response=_BOOLEAN_RESPONSE,
)
MAP_SET_WITH_MAX_IDLE = message(  # 0x014700
    "Map.setWithMaxIdle",
    0x014700,
    request=(*_PUT, _MAX_IDLE),
    response=_DATA_RESPONSE,
)
MAP_SIZE = message(  # 0x012A00
    "Map.size",
    0x012A00,
    request=(_NAME,),
    response=(p("response", INT),),
)
MAP_TRY_LOCK = message(  # 0x011100
    "Map.tryLock",
    0x011100,
    request=(*_KEYED, p("lease", LONG), p("timeout", LONG), p("reference_id", LONG)),
    response=_BOOLEAN_RESPONSE,
)
MAP_TRY_PUT = message(  # 0x010C00
    "Map.tryPut",
    0x010C00,
    request=(_NAME, p("key", DATA), p("value", DATA), p("thread_id", LONG), p("timeout", LONG)),
    response=_BOOLEAN_RESPONSE,
)
MAP_TRY_REMOVE = message(  # 0x010B00
    "Map.tryRemove",
    0x010B00,
    request=(*_KEYED, p("timeout", LONG)),
    response=_BOOLEAN_RESPONSE,
)
MAP_UNLOCK = message(  # 0x011300
    "Map.unlock",
    0x011300,
    request=(*_KEYED, p("reference_id", LONG)),
)
MAP_VALUES = message(  # 0x012400
    "Map.values",
    0x012400,
    request=(_NAME,),
    response=(p("response", list_of(DATA)),),
)
TOPIC_ADD_MESSAGE_LISTENER = message(  # 0x040200
    "Topic.addMessageListener",
    0x040200,
    request=(_NAME, p("local_only", BOOLEAN)),
    response=(p("response", UUID),),
    events=(event("Topic", 0x040202, (p("item", DATA), p("publish_time", LONG), p("uuid", UUID))),),
)
TOPIC_PUBLISH_ALL = message(  # 0x040400
    "Topic.publishAll",
    0x040400,
    request=(_NAME, p("messages", list_of(DATA))),
)
TOPIC_PUBLISH = message(  # 0x040100
    "Topic.publish",
    0x040100,
    request=(_NAME, p("message", DATA)),
)
TOPIC_REMOVE_MESSAGE_LISTENER = message(  # 0x040300
    "Topic.removeMessageListener",
    0x040300,
    request=(_NAME, p("registration_id", UUID)),
    response=_BOOLEAN_RESPONSE,
)

#: Every spec of this module, for the registry and the generated documentation.
ALL: tuple[MessageSpec, ...] = tuple(value for value in list(globals().values()) if isinstance(value, MessageSpec))
