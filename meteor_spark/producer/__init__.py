"""Publishing: the ``Publisher`` (``publisher``), the per-lane accumulator that cuts records into items
(``accumulator``), the sender that puts items into rings and settles their futures (``sender``), the idempotent
path's producer ids and sequences (``idempotence``), publish futures (``futures``) and the batching settings
(``batching``). Built on ``format`` and ``grid``; nothing here knows about consumers or groups.
"""
