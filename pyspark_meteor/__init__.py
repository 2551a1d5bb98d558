"""Auto-registration shim: Spark imports top-level ``pyspark_*`` modules and registers their ``DefaultSource``.

Kept tiny on purpose: Spark imports every ``pyspark_*`` module it finds, so this must not import anything heavy.
"""

from meteor_spark.spark.datasource import MeteorDataSource as DefaultSource

__all__ = ["DefaultSource"]
