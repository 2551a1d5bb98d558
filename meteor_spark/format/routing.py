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
    if ("*" in topic or "#" in topic) and any(word in ("*", "#") for word in topic.split(".")):
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


#: Topics whose verdict a ``TopicMatcher`` remembers; beyond this the memory starts again (bounded).
MATCH_CACHE_TOPICS = 4096


class TopicMatcher:
    """AMQP topic patterns, compiled once: ``*`` is exactly one word, ``#`` zero or more words.

    A topic matches when any pattern matches it. ``""`` is the topic of no words: ``#`` matches it, ``*`` does
    not, the pattern ``""`` matches only it. Words are compared as they are (case-sensitive, an empty word between
    two dots is a word). Verdicts are remembered per topic (``MATCH_CACHE_TOPICS`` at most), because a reader
    filtering every record meets the same few topics again and again.

    Raises:
        ConfigError: a pattern is not a str, is longer than ``MAX_TOPIC_BYTES``, or has a word that mixes a
            wildcard with other characters (``ord*rs``); the error names the pattern.
    """

    __slots__ = ("_cache", "_compiled", "match_all", "patterns")

    def __init__(self, patterns: str | list[str] | tuple[str, ...], what: str = "topics") -> None:
        if isinstance(patterns, str):
            patterns = (patterns,)
        if not isinstance(patterns, (list, tuple)) or not patterns:
            raise ConfigError(
                f"{what} must be a pattern or a non-empty list of patterns (e.g. 'orders.*.created' or "
                f"['orders.#', 'audit']); got {patterns!r}"
            )
        self.patterns: tuple[str, ...] = tuple(check_pattern(p, what) for p in patterns)
        self._compiled = tuple(tuple(p.split(".")) if p else () for p in dict.fromkeys(self.patterns))
        self.match_all = ("#",) in self._compiled
        self._cache: dict[str, bool] = {}

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` (a published topic, ``""`` for none) matches any of the patterns."""
        if self.match_all:
            return True
        verdict = self._cache.get(topic)
        if verdict is None:
            words = tuple(topic.split(".")) if topic else ()
            verdict = any(_match_words(pattern, words) for pattern in self._compiled)
            if len(self._cache) >= MATCH_CACHE_TOPICS:
                self._cache.clear()
            self._cache[topic] = verdict
        return verdict

    def __repr__(self) -> str:
        return f"TopicMatcher({list(self.patterns)!r})"


def check_pattern(pattern: object, what: str = "topics") -> str:
    """``pattern`` if it is a valid AMQP topic pattern: dot-separated words, each ``*``, ``#`` or a plain word."""
    if not isinstance(pattern, str):
        raise ConfigError(f"{what}: pattern {pattern!r} must be a str of dot-separated words, e.g. 'orders.*.created'")
    if len(pattern.encode("utf-8", "surrogatepass")) > MAX_TOPIC_BYTES:
        raise ConfigError(f"{what}: pattern {pattern[:40]!r}... is longer than {MAX_TOPIC_BYTES} bytes")
    for word in pattern.split(".") if pattern else ():
        if word not in ("*", "#") and ("*" in word or "#" in word):
            raise ConfigError(
                f"{what}: pattern {pattern!r} has the word {word!r}: a wildcard is a whole word ('*' one word, "
                f"'#' zero or more words), e.g. 'orders.*' or 'orders.#'"
            )
    return pattern


def _match_words(pattern: tuple[str, ...], words: tuple[str, ...]) -> bool:
    """AMQP matching of one compiled pattern against a topic's words (dynamic programming over both)."""
    # reach[j]: the pattern's words so far can consume exactly the topic's first j words.
    reach = [True] + [False] * len(words)
    for token in pattern:
        if token == "#":
            for j in range(1, len(reach)):
                reach[j] = reach[j] or reach[j - 1]
        else:
            for j in range(len(reach) - 1, 0, -1):
                reach[j] = reach[j - 1] and (token == "*" or token == words[j - 1])
            reach[0] = False
    return reach[-1]
