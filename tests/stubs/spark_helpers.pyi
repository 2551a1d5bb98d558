"""`import spark_helpers` as mypy sees it: pytest puts tests/spark on sys.path at run time; mypy checks the file as
tests.spark.spark_helpers (see [tool.mypy] in pyproject.toml)."""

from tests.spark.spark_helpers import *
