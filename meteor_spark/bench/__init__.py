"""Benchmarks that ship with the product (`meteor bench grid|pubsub|spark`).

Each module exposes ``add_arguments(parser)`` and ``run(args) -> dict``, prints a table, and reports its figures
next to a ceiling measured in the same run. Timing lives here, never in pass/fail tests.
"""
