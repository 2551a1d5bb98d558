"""The record format: what a ring item holds, and nothing about where it is stored.

Record offsets (``offsets``), the item layout on the wire (``wire``), decoded records (``records``), the columnar
form Spark reads and writes (``arrow_columns``), key and value serializers (``serializers``), the policy for items
that cannot be decoded (``corrupt``), which lane a key goes to (``partitioning``) and the W3C trace context records
carry in their headers (``trace_context``, OpenTelemetry imported only when installed). Pure functions over bytes: no
module here talks to the grid, so the format is testable and usable without one.
"""
