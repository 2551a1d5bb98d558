"""docs/supported-protocol.md is generated from the handler registry and must match it."""

from __future__ import annotations

from pathlib import Path

from meteor_spark.server.handlers.docs import supported_protocol_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "supported-protocol.md"


def test_supported_protocol_doc_is_in_sync_with_the_registry() -> None:
    assert DOC.read_text(encoding="utf-8") == supported_protocol_markdown(), (
        "docs/supported-protocol.md is stale; regenerate it with `python -m meteor_spark.server.handlers.docs`"
    )


def test_doc_lists_the_ring_buffer_and_cluster_messages() -> None:
    text = supported_protocol_markdown()
    for needle in ("0x170900 | Ringbuffer.readMany", "0x000100 | Client.authentication", "0x1B0200 | DynamicConfig"):
        assert needle in text
