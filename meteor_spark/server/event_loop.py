"""Which event loop a member process runs on: uvloop when it is installed, else asyncio's own.

A member's time per request is mostly the event loop's (select, transport reads, callbacks) and the codec's; uvloop
(libuv, compiled) does the loop's part in C. Measured on a small map get, the member's CPU per request fell from
about 78 to 64 us, and the round trip of one publish to a parked read with it (``docs/benchmarks.md``). The member
does not depend on it: its transports are used through asyncio's Transport methods only, and without uvloop (or
with ``--event-loop asyncio``) it runs on asyncio's selector loop as before. Only a member process chooses; a
member thread (``EmbeddedGrid(process=False)``) runs on asyncio's loop, beside the application's threads.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable

#: The ``--event-loop`` choices: ``auto`` is uvloop when importable, else asyncio.
EVENT_LOOPS = ("auto", "asyncio", "uvloop")


def uvloop_available() -> bool:
    """True when the uvloop package can be imported (the ``member`` extra installs it)."""
    return importlib.util.find_spec("uvloop") is not None


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """The factory of the event loop ``choice`` names (one of ``EVENT_LOOPS``).

    Raises:
        ValueError: an unknown choice, or ``uvloop`` when it is not installed; the message names the option and the
            fix.
    """
    if choice not in EVENT_LOOPS:
        raise ValueError(f"--event-loop {choice!r}: not one of {', '.join(EVENT_LOOPS)}")
    if choice == "asyncio" or (choice == "auto" and not uvloop_available()):
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError as exc:
        raise ValueError(
            f"--event-loop uvloop: uvloop cannot be imported ({exc}); install it (pip install 'meteor-spark[member]') "
            f"or use --event-loop auto / asyncio"
        ) from None
    new_loop: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return new_loop


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop`` or ``asyncio``: what the member logs when it starts."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
