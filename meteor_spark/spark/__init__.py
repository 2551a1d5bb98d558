"""The Spark connector: ``format("meteor")`` on PySpark's Python Data Source API (PySpark >= 4.2).

``spark.readStream.format("meteor")`` / ``spark.read`` / ``df.writeStream`` / ``df.write`` work after
``pip install meteor-spark`` with no registration (Spark imports the ``pyspark_meteor`` package by itself);
``register(spark)`` is the explicit fallback. Options: ``meteor_spark.spark.options.OPTION_TABLE``.
"""

from __future__ import annotations

from meteor_spark.spark.datasource import MeteorDataSource, register

__all__ = ["MeteorDataSource", "register"]
