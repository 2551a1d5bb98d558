"""Module paths from before the package was cut into layers keep working, with a ``DeprecationWarning``.

``import meteor_spark.subscriber`` (or ``from meteor_spark.publisher import Publisher``) was the way to reach a name
that the facade in ``meteor_spark/__init__.py`` does not list. A finder on ``sys.meta_path`` answers those old
paths with a module that forwards to the new one, so a user's code runs unchanged and the warning says where to
import from now. ``forward`` does the same for names of the two old modules (``grid``, ``groups``) whose path is a
package now.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any

#: old module path -> the module (or modules, first match wins) that hold its names now
MOVED: dict[str, str | tuple[str, ...]] = {
    "meteor_spark.offsets": "meteor_spark.format.offsets",
    "meteor_spark.wire": (
        "meteor_spark.format.wire",
        "meteor_spark.format.item_header",
        "meteor_spark.format.item_encoding",
    ),
    "meteor_spark.records": "meteor_spark.format.records",
    "meteor_spark.arrow_columns": "meteor_spark.format.arrow_columns",
    "meteor_spark.serializers": "meteor_spark.format.serializers",
    "meteor_spark.corrupt": "meteor_spark.format.corrupt",
    "meteor_spark.streams": ("meteor_spark.grid.streams", "meteor_spark.format.partitioning"),
    "meteor_spark.reading": "meteor_spark.grid.reading",
    "meteor_spark.timestamps": "meteor_spark.grid.timestamps",
    "meteor_spark.transactions": "meteor_spark.grid.transactions",
    "meteor_spark.item_gate": "meteor_spark.grid.item_gate",
    "meteor_spark.item_marks": "meteor_spark.grid.item_marks",
    "meteor_spark.publisher": "meteor_spark.producer.publisher",
    "meteor_spark.accumulator": "meteor_spark.producer.accumulator",
    "meteor_spark.sender": "meteor_spark.producer.sender",
    "meteor_spark.idempotence": "meteor_spark.producer.idempotence",
    "meteor_spark.publish_futures": "meteor_spark.producer.futures",
    "meteor_spark.batching": ("meteor_spark.producer.batching", "meteor_spark.grid.streams"),
    "meteor_spark.group_store": "meteor_spark.groups.store",
    "meteor_spark.leases": "meteor_spark.groups.leases",
    "meteor_spark.share_state": "meteor_spark.groups.shared_state",
    "meteor_spark.admin": "meteor_spark.groups.admin",
    "meteor_spark.subscriber": "meteor_spark.consumer.subscriber",
    "meteor_spark.lane_state": "meteor_spark.consumer.lane_state",
    "meteor_spark.receiver": "meteor_spark.consumer.receiver",
    "meteor_spark.refusals": "meteor_spark.consumer.refusals",
    "meteor_spark.auto_confirm": "meteor_spark.consumer.auto_confirm",
    "meteor_spark.shared_groups": (
        "meteor_spark.consumer.shared_subscriber",
        "meteor_spark.consumer.shared_groups",
        "meteor_spark.groups.admin",
    ),
    "meteor_spark.request_reply": "meteor_spark.consumer.request_reply",
    "meteor_spark.demo": "meteor_spark.cli.demo",
    "meteor_spark.spark.bench_session": "meteor_spark.bench.jobs.session",
    "meteor_spark.spark.benchmark": "meteor_spark.bench.jobs.throughput",
    "meteor_spark.spark.latency_benchmark": "meteor_spark.bench.jobs.latency",
    "meteor_spark.spark.txn_benchmark": "meteor_spark.bench.jobs.transactions",
    "meteor_spark.spark.soak": "meteor_spark.bench.jobs.soak",
    "meteor_spark.spark.offsets": "meteor_spark.spark.source_offset",
}


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}: import it from there", DeprecationWarning, stacklevel=3)


def _homes(target: str | tuple[str, ...]) -> tuple[str, ...]:
    return (target,) if isinstance(target, str) else target


def forward(package: str, target: str | tuple[str, ...], name: str) -> Any:
    """``package.name`` for a name the package's former module had: that name from the first module of ``target``
    that has it, with a warning."""
    if name.startswith("__"):
        raise AttributeError(name)
    for module in _homes(target):
        value = getattr(importlib.import_module(module), name, _MISSING)
        if value is not _MISSING:
            _warn(f"{package}.{name}", f"{module}.{name}")
            setattr(sys.modules[package], name, value)  # warned once: later lookups find it without __getattr__
            return value
    raise AttributeError(f"module {package!r} has no attribute {name!r}")


_MISSING = object()


class _Forwarder(importlib.abc.Loader):
    """Loads an old path as a module whose names are those of the new one (the same objects)."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        homes = _homes(MOVED[module.__name__])
        _warn(module.__name__, " and ".join(homes))
        for home in reversed(homes):  # the first home's names win
            target = importlib.import_module(home)
            module.__dict__.update({k: v for k, v in vars(target).items() if not k.startswith("__")})


class _OldPaths(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Forwarder())


def install() -> None:
    """Answer the old paths (once per interpreter)."""
    if not any(isinstance(finder, _OldPaths) for finder in sys.meta_path):
        sys.meta_path.append(_OldPaths())
