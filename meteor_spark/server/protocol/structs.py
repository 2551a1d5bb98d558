"""The protocol's custom structs (``Address``, ``MemberInfo``, ``ErrorHolder``...), declared once as data.

Each struct is a frozen dataclass (the Python value) and a ``StructType`` listing its fields in the order of the
protocol definitions (``hazelcast-client-protocol/protocol-definitions/custom/Custom.yaml``); ``struct_type.StructType``
derives the wire layout. Structs that are engine values too (``RaftGroupId``, ``SimpleEntryView``) use the engine's
class, so handlers pass them through. A table, apart from the codec machinery, so adding a struct touches no code.
"""

from __future__ import annotations

import uuid as uuid_module
from dataclasses import dataclass, field

from meteor_spark.server.engine.atomics import RaftGroupId
from meteor_spark.server.engine.map_types import SimpleEntryView
from meteor_spark.server.protocol.codecs import (
    BOOLEAN,
    BYTE,
    DATA,
    INT,
    LONG,
    STRING,
    UUID,
    list_of,
    map_of,
    nullable,
    p,
)
from meteor_spark.server.protocol.struct_type import StructType


@dataclass(frozen=True)
class Address:
    host: str
    port: int


@dataclass(frozen=True)
class MemberVersion:
    major: int
    minor: int
    patch: int


@dataclass(frozen=True)
class EndpointQualifier:
    type: int  # 0 MEMBER, 1 CLIENT, 2 WAN, 3 REST, 4 MEMCACHE
    identifier: str | None


@dataclass(frozen=True)
class MemberInfo:
    address: Address
    uuid: uuid_module.UUID
    attributes: dict[str, str]
    lite_member: bool
    version: MemberVersion
    address_map: dict[EndpointQualifier, Address] = field(default_factory=dict)


@dataclass(frozen=True)
class DistributedObjectInfo:
    service_name: str
    name: str


@dataclass(frozen=True)
class StackTraceElement:
    class_name: str
    method_name: str
    file_name: str | None
    line_number: int


@dataclass(frozen=True)
class ErrorHolder:
    error_code: int
    class_name: str
    message: str | None
    stack_trace_elements: list[StackTraceElement] = field(default_factory=list)


@dataclass(frozen=True)
class FieldDescriptor:
    field_name: str
    kind: int


@dataclass(frozen=True)
class Schema:
    type_name: str
    fields: list[FieldDescriptor]


@dataclass(frozen=True)
class RingbufferStoreConfigHolder:
    class_name: str | None
    factory_class_name: str | None
    implementation: bytes | None
    factory_implementation: bytes | None
    properties: dict[str, str] | None
    enabled: bool


ADDRESS = StructType("Address", Address, [p("port", INT), p("host", STRING)])
MEMBER_VERSION = StructType("MemberVersion", MemberVersion, [p("major", BYTE), p("minor", BYTE), p("patch", BYTE)])
ENDPOINT_QUALIFIER = StructType(
    "EndpointQualifier", EndpointQualifier, [p("type", INT), p("identifier", nullable(STRING))]
)
MEMBER_INFO = StructType(
    "MemberInfo",
    MemberInfo,
    [
        p("address", ADDRESS),
        p("uuid", UUID),
        p("attributes", map_of(STRING, STRING)),
        p("lite_member", BOOLEAN),
        p("version", MEMBER_VERSION),
        p("address_map", map_of(ENDPOINT_QUALIFIER, ADDRESS), optional=True, default={}),
    ],
)
DISTRIBUTED_OBJECT_INFO = StructType(
    "DistributedObjectInfo", DistributedObjectInfo, [p("service_name", STRING), p("name", STRING)]
)
STACK_TRACE_ELEMENT = StructType(
    "StackTraceElement",
    StackTraceElement,
    [p("class_name", STRING), p("method_name", STRING), p("file_name", nullable(STRING)), p("line_number", INT)],
)
ERROR_HOLDER = StructType(
    "ErrorHolder",
    ErrorHolder,
    [
        p("error_code", INT),
        p("class_name", STRING),
        p("message", nullable(STRING)),
        p("stack_trace_elements", list_of(STACK_TRACE_ELEMENT)),
    ],
)
RAFT_GROUP_ID = StructType("RaftGroupId", RaftGroupId, [p("name", STRING), p("seed", LONG), p("id", LONG)])
SIMPLE_ENTRY_VIEW = StructType(
    "SimpleEntryView",
    SimpleEntryView,
    [
        p("key", DATA),
        p("value", DATA),
        p("cost", LONG),
        p("creation_time", LONG),
        p("expiration_time", LONG),
        p("hits", LONG),
        p("last_access_time", LONG),
        p("last_stored_time", LONG),
        p("last_update_time", LONG),
        p("version", LONG),
        p("ttl", LONG),
        p("max_idle", LONG),
    ],
)
FIELD_DESCRIPTOR = StructType("FieldDescriptor", FieldDescriptor, [p("field_name", STRING), p("kind", INT)])
SCHEMA = StructType("Schema", Schema, [p("type_name", STRING), p("fields", list_of(FIELD_DESCRIPTOR))])
RINGBUFFER_STORE_CONFIG_HOLDER = StructType(
    "RingbufferStoreConfigHolder",
    RingbufferStoreConfigHolder,
    [
        p("class_name", nullable(STRING)),
        p("factory_class_name", nullable(STRING)),
        p("implementation", nullable(DATA)),
        p("factory_implementation", nullable(DATA)),
        p("properties", nullable(map_of(STRING, STRING))),
        p("enabled", BOOLEAN),
    ],
)
