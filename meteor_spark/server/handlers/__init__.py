"""Message handlers. Importing this package registers every handler module in ``registry.HANDLERS``."""

from __future__ import annotations

import importlib
import importlib.util

from meteor_spark.server.handlers import cluster, dynamic_config, ringbuffer  # noqa: F401 - registration

#: Handler modules of the data-structure services (maps, locks, AtomicLong, FlakeId, Topic, CP groups); each is
#: imported when present, so the member serves whatever services are installed.
_SERVICE_MODULES = ("map", "atomic", "flake_id", "topic", "cp")

for _name in _SERVICE_MODULES:
    _module = f"{__name__}.{_name}"
    if importlib.util.find_spec(_module) is not None:
        importlib.import_module(_module)
