"""The Spark side of the benchmarks (``meteor bench spark``, ``meteor bench soak``): the only part of ``bench`` that
imports ``pyspark``, each module started from the matching command module one level up. Importing
it imports the connector first, which fails with one line naming the ``spark`` extra when pyspark is missing.
"""

from __future__ import annotations

from meteor_spark.spark import PYSPARK_MISSING as PYSPARK_MISSING  # the connector's check: names the `spark` extra
