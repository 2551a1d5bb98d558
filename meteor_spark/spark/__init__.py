"""The Spark connector: ``format("meteor")`` on PySpark's Python Data Source API (PySpark >= 4.2).

``spark.readStream.format("meteor")`` / ``spark.read`` / ``df.writeStream`` / ``df.write`` work after
``pip install 'meteor-spark[spark]'`` (or plain ``meteor-spark`` next to an existing pyspark) with no registration
(Spark imports the ``pyspark_meteor`` package by itself); ``register(spark)`` is the explicit fallback.
Options: ``meteor_spark.spark.options.OPTION_TABLE``.
"""

from __future__ import annotations

#: What to do when pyspark is not installed (the core does not need it; the connector, `meteor demo` and
#: `meteor bench spark` do).
PYSPARK_MISSING = "meteor_spark.spark needs pyspark: pip install 'meteor-spark[spark]'"

try:
    import pyspark  # noqa: F401
except ImportError as exc:
    raise ModuleNotFoundError(PYSPARK_MISSING, name="pyspark") from exc

from meteor_spark.spark.datasource import MeteorDataSource, register  # noqa: E402

__all__ = ["MeteorDataSource", "register"]
