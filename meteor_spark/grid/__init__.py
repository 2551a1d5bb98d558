"""Grid access: the connection settings (``settings``), the client (``client``, the one module that imports
``hazelcast``) and what the product keeps in the grid beside the records: stream metadata (``streams``), reading
ring ranges (``reading``), positions by time (``timestamps``), transaction records (``transactions``), the item gate
that hides uncommitted items (``item_gate``) and the marks that tell a ring's incarnation (``item_marks``).

``Grid`` and ``GridSettings`` are importable from here, as before the layers existed; any other name of the former
``meteor_spark.grid`` module still resolves, with a ``DeprecationWarning`` naming its module now (``settings`` for
what it defines, else ``client``).
"""

from __future__ import annotations

from typing import Any

from meteor_spark._moved import forward
from meteor_spark.grid.client import Grid, GridSettings

__all__ = ["Grid", "GridSettings"]


def __getattr__(name: str) -> Any:
    return forward(__name__, ("meteor_spark.grid.settings", "meteor_spark.grid.client"), name)
