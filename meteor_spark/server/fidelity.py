"""Where the embedded member knowingly answers differently from the real Hazelcast member it mimics.

``KNOWN_DIFFERENCES`` maps a scenario of the differential test (``tests/server/test_fidelity.py``, which runs each
scenario against a real Hazelcast member and the embedded member through the official client) to the reason the
answers differ. ``docs/supported-protocol.md`` is generated with this list, and the test fails on a difference that
is not listed as well as on a listed one that has gone, so the three never disagree.
"""

from __future__ import annotations

MIMICKED_VERSION = "5.7.0"
"""The Hazelcast release the embedded member reports being and is compared against."""

KNOWN_DIFFERENCES: dict[str, str] = {}
