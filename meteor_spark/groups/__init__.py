"""Subscriber groups as state in the grid: the exclusive group's member protocol (``exclusive``: assignment,
fencing, confirmed offsets), what a group stores (``store``), lane leases (``leases``), a shared group's locks and
delivery counts (``shared_state``) and group administration (``admin``: describe, seek, delete, lag).

Built on ``format`` and ``grid``; the consumers that use a group live in ``meteor_spark.consumer``. Names of the
former ``meteor_spark.groups`` module still resolve from here, with a ``DeprecationWarning`` naming their module now.
"""

from __future__ import annotations

from typing import Any

from meteor_spark._moved import forward


def __getattr__(name: str) -> Any:
    return forward(
        __name__, ("meteor_spark.groups.exclusive", "meteor_spark.groups.balancing", "meteor_spark.groups.admin"), name
    )
