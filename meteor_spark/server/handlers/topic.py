"""Topic messages (service 0x04): publish, publish_all and message listeners."""

from __future__ import annotations

from typing import Any

from meteor_spark.server.engine.topics import TopicMessage
from meteor_spark.server.handlers.registry import RequestContext, handles
from meteor_spark.server.protocol import messages_data as m

_TOPIC_EVENT = m.TOPIC_ADD_MESSAGE_LISTENER.event("Topic")


@handles(m.TOPIC_PUBLISH)
async def publish(ctx: RequestContext, req: dict[str, Any]) -> None:
    ctx.engine.topics.publish(req["name"], req["message"])


@handles(m.TOPIC_PUBLISH_ALL)
async def publish_all(ctx: RequestContext, req: dict[str, Any]) -> None:
    ctx.engine.topics.publish_all(req["name"], req["messages"])


@handles(m.TOPIC_ADD_MESSAGE_LISTENER)
async def add_message_listener(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    topics, name = ctx.engine.topics, req["name"]
    member_uuid = ctx.member.member_uuid

    def deliver(message: TopicMessage) -> None:
        ctx.send_event(_TOPIC_EVENT, publish_time=message.publish_time, uuid=member_uuid, item=message.item)

    registration = topics.add_listener(name, deliver)
    ctx.endpoint.on_close(("topic-listener", registration), lambda: topics.remove_listener(name, registration))
    return {"response": registration}


@handles(m.TOPIC_REMOVE_MESSAGE_LISTENER)
async def remove_message_listener(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    registration = req["registration_id"]
    removed = ctx.engine.topics.remove_listener(req["name"], registration)
    ctx.endpoint.remove_on_close(("topic-listener", registration))
    return {"response": removed}
