"""The ``meteor`` command line. The console script is ``meteor_spark.cli.main:main`` (``main(argv) -> int``)."""
