"""Which Python interpreter Spark's Python workers run, checked before the first read needs it.

PySpark starts its workers with ``SparkContext.pythonExec`` (``$PYSPARK_PYTHON`` when the context started, else
``python3`` from the PATH). When that interpreter cannot import ``meteor_spark`` (a virtualenv run as
``.venv/bin/python job.py`` without activating it, a wheel installed into one interpreter), the first read fails on a
worker with a ``ModuleNotFoundError`` or a long Java trace that never names the cause.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from typing import Any

from meteor_spark.errors import ConfigError

logger = logging.getLogger(__name__)

#: Seconds a check of the workers' interpreter may take (an interpreter start and one import).
CHECK_TIMEOUT_S = 60.0


def ensure_workers_python(spark: Any) -> None:
    """Make sure the Python workers of ``spark`` can import ``meteor_spark``.

    On a local master (workers on this machine), an interpreter that cannot is replaced by this one, the one
    running the driver (``SparkContext.pythonExec`` and ``$PYSPARK_PYTHON``, so functions registered from now on
    use it). Elsewhere the workers' interpreter is the cluster's business: a ``ConfigError`` names
    ``PYSPARK_PYTHON`` and the fix. Spark Connect sessions (no ``sparkContext``) are left alone: their workers run
    on the server.

    Raises:
        ConfigError: a non-local master whose workers' interpreter cannot import ``meteor_spark``.
    """
    try:
        context = spark.sparkContext
    except Exception:  # Spark Connect: the server's workers, not this process's business
        return
    current = str(getattr(context, "pythonExec", "") or "python3")
    if _same_as_driver(current) or _imports_meteor_spark(current):
        return
    master = str(getattr(context, "master", ""))
    if master.startswith("local"):
        logger.info(
            "Spark's Python workers would run %r, which cannot import meteor_spark; using this interpreter (%s) "
            "instead (set PYSPARK_PYTHON to choose another)",
            current,
            sys.executable,
        )
        context.pythonExec = sys.executable
        os.environ["PYSPARK_PYTHON"] = sys.executable
        return
    raise ConfigError(
        f"Spark's Python workers run {current!r} (PYSPARK_PYTHON / spark.pyspark.python), which cannot import "
        f"meteor_spark; install meteor-spark into that interpreter on every worker, or set PYSPARK_PYTHON to one "
        f"that has it (e.g. PYSPARK_PYTHON={sys.executable}) before the session starts"
    )


def _same_as_driver(executable: str) -> bool:
    found = shutil.which(executable) or executable
    return os.path.abspath(found) == os.path.abspath(sys.executable)


def _imports_meteor_spark(executable: str) -> bool:
    try:
        done = subprocess.run(
            [executable, "-c", "import meteor_spark"], capture_output=True, timeout=CHECK_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0
