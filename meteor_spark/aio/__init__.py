"""The asyncio API: ``AsyncPublisher`` and ``AsyncSubscriber`` on the official asyncio Hazelcast client,
request/reply on them (``AsyncRequester`` / ``AsyncResponder``), and consume-transform-produce transactions
(``AsyncTransactionalPublisher``).

They run on the caller's event loop with no thread of their own, and keep the threaded API's semantics, options and
errors by reusing its socket-free pieces (the ring-item format, the idempotent search, the item gate, the
``on_corrupt`` policy, the option checks, the exclusive-group protocol's decisions: ``AsyncSubscriber(group=...)``
and ``AsyncGroupMember``). ``AsyncGrid`` (``meteor_spark.grid.aio_client``) is the connection; the
clients also take a ``"host:port[,host:port]"`` string or a ``GridSettings`` and then own their connection.
"""

from meteor_spark.aio.group_member import AsyncGroupMember
from meteor_spark.aio.publisher import AsyncPublisher
from meteor_spark.aio.request_reply import AsyncRequester, AsyncResponder
from meteor_spark.aio.shared_subscriber import AsyncSharedSubscriber
from meteor_spark.aio.subscriber import AsyncSubscriber
from meteor_spark.aio.transactional import AsyncTransactionalPublisher
from meteor_spark.grid.aio_client import AsyncGrid

__all__ = [
    "AsyncGrid",
    "AsyncGroupMember",
    "AsyncPublisher",
    "AsyncRequester",
    "AsyncResponder",
    "AsyncSharedSubscriber",
    "AsyncSubscriber",
    "AsyncTransactionalPublisher",
]
