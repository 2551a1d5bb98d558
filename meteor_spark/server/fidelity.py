"""Where the embedded member knowingly answers differently from the real Hazelcast member it mimics.

The differential test (``tests/server/test_fidelity.py``) runs each of its scenarios against a real Hazelcast member
and the embedded member through the official client and compares the answers field by field. ``KNOWN_DIFFERENCES``
maps a scenario to the reason its answers may differ; the test fails on a difference that is not listed and on a
listed one that has gone. ``UNCOMPARED_DIFFERENCES`` are the differences no scenario can show (a Python client cannot
send Java code; one member has no cluster). ``docs/supported-protocol.md`` is generated from both lists, so the
page, the test and the member never disagree.
"""

from __future__ import annotations

MIMICKED_VERSION = "5.7.0"
"""The Hazelcast release the embedded member reports being, and the one the differential test compares it with."""

CP_UNSAFE_VERSION = "5.3.8"
"""The release ``cp_mode="unsafe"`` is compared with (the CP "unsafe mode" of Hazelcast 4.x-5.4)."""

KNOWN_DIFFERENCES: dict[str, str] = {}
"""Scenario name -> why the embedded member's answer differs from the real member's (none at present)."""

UNCOMPARED_DIFFERENCES: dict[str, str] = {
    "Java code": (
        "a ring read filter that is a real `IFunction`, AtomicLong `apply`/`alter` with one, entry processors, "
        "RingbufferStore and MapStore are Java code, which the embedded member cannot run: it answers "
        "`UnsupportedOperationException` (61) saying how to do without (filter in the client, compare-and-set in a "
        "loop, `--data-dir` for durability). A value that is no function at all (a string, a number, a list, an "
        "unknown Java class) gets the `ClassCastException` / `HazelcastSerializationException` a member gives"
    ),
    "One member": (
        "no cluster: backup counts are validated and ignored, partitions never migrate, the member list has one "
        "entry and flake ids carry node id 1 (the first member's)"
    ),
    "Entry cost": (
        "a map entry view's `cost` is the key and value bytes; a member's is its own heap estimate (both positive)"
    ),
    "Error detail": (
        "error responses carry no Java stack trace, and where a member's message shows a Java identity hash "
        "(`RingbufferService@1b2c3d4e`) the embedded member shows a number fixed for its process"
    ),
    "Expiry timing": (
        "expired map entries nobody reads are swept every second (a member samples every 5 s); both expire an entry "
        "on access. An entry view reports TTL and max-idle in whole seconds as a member does, but the embedded "
        "member expires on the exact millisecond, where a member's record clock has whole-second resolution: a "
        "sub-second TTL may end up to a second apart"
    ),
    "CP unsafe mode": (
        '`cp_mode="unsafe"` answers CP requests as Hazelcast 5.3.8 does, while the member still reports 5.7.0'
    ),
}
"""Differences no scenario of the differential test can show, with their reason."""
