"""Reading: the ``Subscriber`` (``subscriber``) with its per-lane positions (``lane_state``), the push-style
``Receiver`` (``receiver``), refused records and dead letters (``refusals``), auto-confirm (``auto_confirm``), the
shared group's subscriber (``shared_subscriber``) and request/reply over streams (``request_reply``). The top of the
core: built on ``format``, ``grid``, ``producer`` (dead letters and replies are published) and ``groups``.
"""
