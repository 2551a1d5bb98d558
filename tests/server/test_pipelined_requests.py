"""Several requests in one read (a client sending without waiting for each answer): each is served, in order,
whether the member decodes it straight from the received bytes or cuts it into frames first, and a request split
across reads is served once its rest arrives."""

from __future__ import annotations

from typing import Any

import pytest

from meteor_spark.server import EmbeddedGrid
from meteor_spark.server.protocol import message_codec
from meteor_spark.server.protocol import messages as m
from meteor_spark.server.protocol import messages_data as md
from tests.server.raw_client import ERROR_RESPONSE_TYPE, RawClient, correlation_id_of, message_type_of

pytestmark = pytest.mark.embedded_only

Request = tuple[message_codec.MessageSpec, dict[str, Any]]


def _add_all(items: list[bytes]) -> Request:
    return m.RINGBUFFER_ADD_ALL, {"name": "pipelined", "value_list": items, "overflow_policy": 0}


def _responses(client: RawClient, requests: list[Request], ids: list[int]) -> list[dict[str, Any]]:
    answers = []
    for (spec, _), correlation_id in zip(requests, ids, strict=True):
        message = client.receive()
        assert correlation_id_of(message) == correlation_id  # answered in the order sent
        assert message_type_of(message) != ERROR_RESPONSE_TYPE, spec.name
        answers.append(message_codec.decode_response(spec, message))
    return answers


def _data(key: str) -> bytes:
    return b"\x00\x00\x00\x00\xff\xff\xff\xf9" + key.encode()  # a serialized string (type id -7)


def test_requests_sent_together_are_all_answered_in_order() -> None:
    items = [bytes([n]) * 5000 for n in range(10)]
    requests: list[Request] = [
        _add_all(items),
        (md.MAP_PUT, {"name": "pipelined", "key": _data("k"), "value": _data("v1"), "thread_id": 1, "ttl": -1}),
        # Map.putAll has no compiled decoder: it and everything after it are cut into frames
        (md.MAP_PUT_ALL, {"name": "pipelined", "entries": [(_data("j"), _data("w"))], "trigger_map_loader": True}),
        (md.MAP_GET, {"name": "pipelined", "key": _data("k"), "thread_id": 1}),
        _add_all(items[:3]),
        (m.RINGBUFFER_SIZE, {"name": "pipelined"}),
    ]
    with EmbeddedGrid(process=True) as member, RawClient(member.address) as client:
        client.authenticate(member.cluster_name)
        answers = _responses(client, requests, client.send_all(requests))
        assert [answer.get("response") for answer in answers] == [9, None, None, _data("v1"), 12, 13]
        # Compiled requests only, the last one split across two writes.
        more: list[Request] = [
            _add_all(items[:2]),
            (md.MAP_GET, {"name": "pipelined", "key": _data("j"), "thread_id": 1}),
            _add_all(items[2:5]),
        ]
        ids, data = client.encode_all(more)
        client.sock.sendall(data[: len(data) - 7000])
        first = _responses(client, more[:2], ids[:2])
        client.sock.sendall(data[len(data) - 7000 :])
        last = _responses(client, more[2:], ids[2:])
        assert [answer.get("response") for answer in first + last] == [14, _data("w"), 17]
