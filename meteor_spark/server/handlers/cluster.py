"""Client and cluster messages: authentication, cluster view, backup listener, ping, statistics, proxies,
distributed objects and their listener, compact schemas."""

from __future__ import annotations

import hmac
import logging
import uuid as uuid_module
from typing import Any

from meteor_spark.server.handlers.registry import RequestContext, handles
from meteor_spark.server.protocol import messages as m
from meteor_spark.server.protocol.structs import (
    Address,
    DistributedObjectInfo,
    EndpointQualifier,
    MemberInfo,
    MemberVersion,
    Schema,
)

logger = logging.getLogger(__name__)

AUTHENTICATED = 0
CREDENTIALS_FAILED = 1
SERIALIZATION_VERSION_MISMATCH = 2
NOT_ALLOWED_IN_CLUSTER = 3

SERIALIZATION_VERSION = 1

MEMBER_QUALIFIER = 0
CLIENT_QUALIFIER = 1


def member_info(ctx: RequestContext) -> MemberInfo:
    member = ctx.member
    address = Address(member.host, member.port)
    major, minor, patch = (int(part) for part in (member.version.split(".") + ["0", "0"])[:3])
    return MemberInfo(
        address=address,
        uuid=member.member_uuid,
        attributes={},
        lite_member=False,
        version=MemberVersion(major, minor, patch),
        address_map={
            EndpointQualifier(MEMBER_QUALIFIER, None): address,
            EndpointQualifier(CLIENT_QUALIFIER, None): address,
        },
    )


def _authenticate(
    ctx: RequestContext, req: dict[str, Any], username: str | None, password: str | None
) -> dict[str, Any]:
    member = ctx.member
    status = AUTHENTICATED
    reason = ""
    if req["cluster_name"] != member.cluster_name:
        status, reason = CREDENTIALS_FAILED, f"cluster name {req['cluster_name']!r} is not {member.cluster_name!r}"
    elif member.username is not None and not (
        username == member.username
        and password is not None
        and hmac.compare_digest(password.encode("utf-8"), (member.password or "").encode("utf-8"))
    ):
        status, reason = CREDENTIALS_FAILED, f"wrong username or password (username {username!r})"
    elif member.username is None and (username is not None or password is not None):
        # As a Hazelcast member without security configured: it refuses every client that presents credentials.
        status, reason = CREDENTIALS_FAILED, "credentials presented to a member that has none configured"
    elif req["serialization_version"] != SERIALIZATION_VERSION:
        status, reason = SERIALIZATION_VERSION_MISMATCH, f"serialization version {req['serialization_version']}"
    endpoint = ctx.endpoint
    if status == AUTHENTICATED:
        endpoint.authenticated = True
        endpoint.client_uuid = req["uuid"]
        endpoint.client_name = req["client_name"]
        endpoint.client_type = req["client_type"]
        endpoint.client_version = req["client_hazelcast_version"]
        endpoint.labels = list(req["labels"])
        logger.info(
            "client %s (%s %s, uuid %s) authenticated from %s",
            endpoint.client_name,
            endpoint.client_type,
            endpoint.client_version,
            endpoint.client_uuid,
            endpoint.remote,
        )
    else:
        logger.warning("refused client %s from %s: %s", req["client_name"], endpoint.remote, reason)
    return {
        "status": status,
        "address": Address(member.host, member.port) if status == AUTHENTICATED else None,
        "member_uuid": member.member_uuid if status == AUTHENTICATED else None,
        "serialization_version": SERIALIZATION_VERSION,
        "server_hazelcast_version": member.version,
        "partition_count": member.partition_count,
        "cluster_id": member.cluster_id if status == AUTHENTICATED else None,
        "failover_supported": False,
    }


@handles(m.CLIENT_AUTHENTICATION, needs_auth=False)
async def authentication(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return _authenticate(ctx, req, req["username"], req["password"])


@handles(m.CLIENT_AUTHENTICATION_CUSTOM, needs_auth=False)
async def authentication_custom(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    # Token credentials: a member without username/password accepts them (as Hazelcast without a security realm
    # does); one with a username/password refuses them (CREDENTIALS_FAILED), having no way to check a token.
    return _authenticate(ctx, req, None, None)


@handles(m.CLIENT_ADD_CLUSTER_VIEW_LISTENER)
async def add_cluster_view_listener(ctx: RequestContext, req: dict[str, Any]) -> None:
    # The client applies views with a version above its current one and resets it to 0 when it re-registers,
    # so version 1 of a one-member cluster is always accepted.
    members_view, partitions_view = m.CLIENT_ADD_CLUSTER_VIEW_LISTENER.events
    ctx.send_event(members_view, version=1, member_infos=[member_info(ctx)])
    ctx.send_event(
        partitions_view,
        version=1,
        partitions=[(ctx.member.member_uuid, list(range(ctx.member.partition_count)))],
    )
    return None


@handles(m.CLIENT_LOCAL_BACKUP_LISTENER)
async def local_backup_listener(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    # One member has no backups, so no backup event is ever sent; every response reports 0 backup acks.
    return {"response": uuid_module.uuid4()}


@handles(m.CLIENT_PING)
async def ping(ctx: RequestContext, req: dict[str, Any]) -> None:
    return None


@handles(m.CLIENT_STATISTICS)
async def statistics(ctx: RequestContext, req: dict[str, Any]) -> None:
    return None


@handles(m.CLIENT_CREATE_PROXY)
async def create_proxy(ctx: RequestContext, req: dict[str, Any]) -> None:
    ctx.engine.proxies.create(req["service_name"], req["name"])
    return None


@handles(m.CLIENT_DESTROY_PROXY)
async def destroy_proxy(ctx: RequestContext, req: dict[str, Any]) -> None:
    ctx.engine.proxies.destroy(req["service_name"], req["name"])
    return None


@handles(m.CLIENT_GET_DISTRIBUTED_OBJECTS)
async def get_distributed_objects(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return {"response": [DistributedObjectInfo(service, name) for service, name in ctx.engine.proxies.list()]}


@handles(m.CLIENT_ADD_DISTRIBUTED_OBJECT_LISTENER)
async def add_distributed_object_listener(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    registration = uuid_module.uuid4()
    event = m.CLIENT_ADD_DISTRIBUTED_OBJECT_LISTENER.events[0]
    source = ctx.member.member_uuid

    def listener(name: str, service_name: str, event_type: str) -> None:
        ctx.send_event(event, name=name, service_name=service_name, event_type=event_type, source=source)

    proxies = ctx.engine.proxies
    proxies.add_listener(registration, listener)
    ctx.endpoint.on_close(registration, lambda: proxies.remove_listener(registration))
    return {"response": registration}


@handles(m.CLIENT_REMOVE_DISTRIBUTED_OBJECT_LISTENER)
async def remove_distributed_object_listener(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    registration = req["registration_id"]
    ctx.endpoint.remove_on_close(registration)
    return {"response": ctx.engine.proxies.remove_listener(registration)}


def schema_id(schema: Schema) -> int:
    """Hazelcast's compact schema id: the Rabin fingerprint (CRC-64 variant) of type name and fields."""
    fingerprint = _INIT
    fingerprint = _fingerprint_string(fingerprint, schema.type_name)
    fingerprint = _fingerprint_int(fingerprint, len(schema.fields))
    for descriptor in sorted(schema.fields, key=lambda d: d.field_name):
        fingerprint = _fingerprint_string(fingerprint, descriptor.field_name)
        fingerprint = _fingerprint_int(fingerprint, descriptor.kind)
    return fingerprint - (1 << 64) if fingerprint >= (1 << 63) else fingerprint


_INIT = 0xC15D213AA4D7A795


def _make_table() -> list[int]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_INIT & -(fp & 1))
        table.append(fp & 0xFFFFFFFFFFFFFFFF)
    return table


_TABLE = _make_table()


def _fingerprint_byte(fp: int, value: int) -> int:
    return ((fp >> 8) ^ _TABLE[(fp ^ value) & 0xFF]) & 0xFFFFFFFFFFFFFFFF


def _fingerprint_int(fp: int, value: int) -> int:
    for shift in (0, 8, 16, 24):
        fp = _fingerprint_byte(fp, (value >> shift) & 0xFF)
    return fp


def _fingerprint_string(fp: int, value: str) -> int:
    data = value.encode("utf-8")
    fp = _fingerprint_int(fp, len(data))
    for byte in data:
        fp = _fingerprint_byte(fp, byte)
    return fp


@handles(m.CLIENT_SEND_SCHEMA)
async def send_schema(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    schema: Schema = req["schema"]
    ctx.engine.schemas[schema_id(schema)] = schema
    # The client needs the member's uuid in the answer to know the schema is replicated to it.
    return {"response": [ctx.member.member_uuid]}


@handles(m.CLIENT_FETCH_SCHEMA)
async def fetch_schema(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return {"response": ctx.engine.schemas.get(req["schema_id"])}


@handles(m.CLIENT_SEND_ALL_SCHEMAS)
async def send_all_schemas(ctx: RequestContext, req: dict[str, Any]) -> None:
    for schema in req["schemas"]:
        ctx.engine.schemas[schema_id(schema)] = schema
    return None
