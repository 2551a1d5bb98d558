"""A record's topic and message id: what they may hold, and how they travel in a ring item.

Both ride as reserved headers (``meteor.topic``, ``meteor.id``) so the item format stays as it is: readers of
older versions see two more headers, Arrow and Spark see them in the ``headers`` column, and ``Record.topic`` /
``Record.message_id`` are filled from them when records are made. A topic is an AMQP routing key: dot-separated
words (``orders.eu.created``), ``""`` for none; the words ``*`` and ``#`` are the matchers' wildcards, so a
published topic may not contain them. A message id is what a stream's deduplication window compares.
"""

from __future__ import annotations

from meteor_spark.errors import ArgumentTypeError, ConfigError

TOPIC_HEADER = "meteor.topic"
MESSAGE_ID_HEADER = "meteor.id"
ROUTING_HEADERS = (TOPIC_HEADER, MESSAGE_ID_HEADER)

#: Longest topic and message id, in UTF-8 bytes (AMQP's routing key limit is 255 bytes).
MAX_TOPIC_BYTES = 255
MAX_MESSAGE_ID_BYTES = 255


def check_topic(topic: object, what: str = "topic") -> str:
    """``topic`` if it is a valid published topic: words separated by dots, no ``*`` or ``#`` word."""
    if not isinstance(topic, str):
        raise ArgumentTypeError(f"{what} must be a str of dot-separated words, e.g. 'orders.eu.created'; got {topic!r}")
    if len(topic.encode("utf-8", "surrogatepass")) > MAX_TOPIC_BYTES:
        raise ConfigError(f"{what} {topic[:40]!r}... is longer than {MAX_TOPIC_BYTES} bytes (AMQP's routing key limit)")
    if topic and any(word in ("*", "#") for word in topic.split(".")):
        raise ConfigError(
            f"{what} {topic!r} has a wildcard word: '*' and '#' match topics when subscribing; a published "
            f"topic names one route (e.g. 'orders.eu.created')"
        )
    return topic


def check_message_id(message_id: object, what: str = "message_id") -> str:
    """``message_id`` if it is a non-empty str of at most ``MAX_MESSAGE_ID_BYTES`` bytes."""
    if not isinstance(message_id, str):
        raise ArgumentTypeError(f"{what} must be a str (e.g. an order number or a UUID) or None; got {message_id!r}")
    if not message_id or len(message_id.encode("utf-8", "surrogatepass")) > MAX_MESSAGE_ID_BYTES:
        raise ConfigError(
            f"{what} {message_id[:40]!r} must have 1 to {MAX_MESSAGE_ID_BYTES} bytes; use a shorter id (e.g. a "
            f"hash of a long one)"
        )
    return message_id


def routing_headers(
    headers: tuple[tuple[str, bytes], ...], topic: str, message_id: str | None
) -> tuple[tuple[str, bytes], ...]:
    """``headers`` with the reserved ones set from ``topic`` and ``message_id`` (replacing any given)."""
    out = tuple(pair for pair in headers if pair[0] not in ROUTING_HEADERS)
    if topic:
        out += ((TOPIC_HEADER, topic.encode("utf-8")),)
    if message_id is not None:
        out += ((MESSAGE_ID_HEADER, message_id.encode("utf-8")),)
    return out


def routing_of(headers: tuple[tuple[str, bytes], ...]) -> tuple[str, str | None]:
    """The topic (``""`` for none) and message id (None) that ``headers`` carry."""
    topic = ""
    message_id = None
    for name, value in headers:
        if name == TOPIC_HEADER:
            topic = value.decode("utf-8", "replace")
        elif name == MESSAGE_ID_HEADER:
            message_id = value.decode("utf-8", "replace")
    return topic, message_id
