"""Connection settings of a grid client: ``GridSettings`` (members, cluster name, credentials, TLS files, timeouts,
the grid's frame limit) and the checks made on them before any connection is tried.

Plain data and validation, apart from the client (``meteor_spark.grid.client``, the one module that imports
``hazelcast``, turns them into a connection): what every entry point (Spark options, TOML, environment, CLI flags)
parses and checks the same way.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from meteor_spark.errors import ConfigError, unknown_option
from meteor_spark.validate import check_int

#: Where a client looks for the grid when told nothing else.
DEFAULT_ADDRESS = "127.0.0.1:5701"

#: The largest frame (6-byte frame header included) the embedded member accepts from a client; a larger one drops
#: the connection (``meteor_spark.server.protocol.frames.MAX_FRAME_SIZE``).
EMBEDDED_MAX_FRAME_BYTES = 256 * 1024 * 1024

#: The largest frame a Hazelcast 5.x member can take from an authenticated client: the frame length is a signed
#: 32-bit field (``ClientMessageReader``; ``hazelcast.client.protocol.unverified.message.bytes``, 4096, limits
#: only the messages sent before authentication). The member allocates each frame whole on its heap.
HAZELCAST_MAX_FRAME_BYTES = (1 << 31) - 1

#: ``GridSettings.max_frame_bytes`` by default: the smaller of the two, so a record either grid would drop the
#: connection for is refused before it is sent, whichever grid the client talks to.
DEFAULT_MAX_FRAME_BYTES = min(EMBEDDED_MAX_FRAME_BYTES, HAZELCAST_MAX_FRAME_BYTES)

#: Bytes a ring item's frame carries besides its records' value, key and header bytes: the frame header (6), the
#: serialized-data header (8), the item header (``wire.HEADER_SIZE``, 48) and the per-record columns of one record
#: (lengths, timestamp, header counts; 64 is ample).
ITEM_FRAME_OVERHEAD = 6 + 8 + 48 + 64


@dataclass(frozen=True)
class GridSettings:
    """How to reach a Hazelcast cluster (embedded or real).

    Attributes:
        members: ``host:port`` addresses of one or more members.
        cluster_name: the cluster name members are configured with.
        username: optional username (Hazelcast username/password credentials).
        password: optional password; never logged or shown in ``repr``.
        ssl_enabled: use TLS; the remaining ``ssl_*`` fields pass through to the client unchanged.
        ssl_cafile: CA bundle used to verify members.
        ssl_certfile: client certificate (mutual TLS).
        ssl_keyfile: client private key (mutual TLS).
        ssl_password: password of the private key; never logged.
        ssl_check_hostname: verify the member's host name against its certificate.
        connect_timeout_s: give up connecting to the cluster after this long (Hazelcast's default is forever).
        invocation_timeout_s: how long the client retries a failing operation.
        smart_routing: connect to every member and route by partition (Hazelcast's default).
        max_frame_bytes: the largest frame the grid accepts (a ring item travels as one frame). Publishers refuse
            a record that cannot fit with ``SizeLimitError`` before sending anything: a frame over the member's
            limit would drop the connection and every call on it. Default 256 MiB, the embedded member's limit;
            a Hazelcast member takes up to 2 GiB - 1 (raise it for such a cluster, if its heap can hold them).
    """

    members: tuple[str, ...] = (DEFAULT_ADDRESS,)
    cluster_name: str = "dev"
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ssl_enabled: bool = False
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: str | None = field(default=None, repr=False)
    ssl_check_hostname: bool = False
    connect_timeout_s: float = 10.0
    invocation_timeout_s: float = 60.0
    smart_routing: bool = True
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES

    # Option names accepted after the ``hazelcast.`` prefix (Spark options, TOML, CLI); value = field name.
    _OPTION_NAMES = {
        "members": "members",
        "clustername": "cluster_name",
        "username": "username",
        "password": "password",
        "ssl.enabled": "ssl_enabled",
        "ssl.cafile": "ssl_cafile",
        "ssl.certfile": "ssl_certfile",
        "ssl.keyfile": "ssl_keyfile",
        "ssl.password": "ssl_password",
        "ssl.checkhostname": "ssl_check_hostname",
        "connecttimeout": "connect_timeout_s",
        "invocationtimeout": "invocation_timeout_s",
        "smartrouting": "smart_routing",
        "maxframebytes": "max_frame_bytes",
    }

    #: Documentation of each ``hazelcast.*`` option: (public name, default shown, meaning).
    OPTION_DOCS = (
        ("hazelcast.members", DEFAULT_ADDRESS, "comma-separated host:port of cluster members"),
        ("hazelcast.clusterName", "dev", "cluster name the members are configured with"),
        ("hazelcast.username", "(none)", "username for username/password credentials"),
        ("hazelcast.password", "(none)", "password for username/password credentials (never logged)"),
        ("hazelcast.ssl.enabled", "false", "connect with TLS"),
        ("hazelcast.ssl.cafile", "(none)", "CA bundle used to verify members"),
        ("hazelcast.ssl.certfile", "(none)", "client certificate for mutual TLS"),
        ("hazelcast.ssl.keyfile", "(none)", "client private key for mutual TLS"),
        ("hazelcast.ssl.password", "(none)", "password of the client private key (never logged)"),
        ("hazelcast.ssl.checkHostname", "false", "verify the member host name against its certificate"),
        ("hazelcast.connectTimeout", "10", "seconds to keep trying to reach the cluster before failing"),
        ("hazelcast.invocationTimeout", "60", "seconds the client retries a failing operation"),
        ("hazelcast.smartRouting", "true", "connect to all members and route by partition"),
        (
            "hazelcast.maxFrameBytes",
            str(DEFAULT_MAX_FRAME_BYTES),
            "largest frame the grid accepts; a bigger record is refused before sending (SizeLimitError)",
        ),
    )

    def __post_init__(self) -> None:
        # "a:5701,b:5701" (one string, or inside a tuple) means two members, as in the hazelcast.members option
        object.__setattr__(self, "members", split_members(self.members))
        if not self.members:
            raise ConfigError("hazelcast.members is empty; give at least one host:port, e.g. 127.0.0.1:5701")
        for member in self.members:
            host, sep, port = member.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"hazelcast.members: {member!r} is not host:port; write it like 127.0.0.1:5701")
        if not self.cluster_name:
            raise ConfigError("hazelcast.clusterName is empty; the default cluster name is 'dev'")
        if (self.username is None) != (self.password is None):
            raise ConfigError("hazelcast.username and hazelcast.password go together; set both or neither")
        if self.connect_timeout_s <= 0:
            raise ConfigError(f"hazelcast.connectTimeout must be > 0 seconds, got {self.connect_timeout_s}")
        if self.invocation_timeout_s <= 0:
            raise ConfigError(f"hazelcast.invocationTimeout must be > 0 seconds, got {self.invocation_timeout_s}")
        check_int(
            "hazelcast.maxFrameBytes",
            self.max_frame_bytes,
            4096,
            HAZELCAST_MAX_FRAME_BYTES,
            what="(bytes; a Hazelcast member's frame length is a signed 32-bit int)",
        )

    @property
    def max_record_bytes(self) -> int:
        """The most value, key and header bytes one record may carry: it travels in a ring item of its own."""
        return self.max_frame_bytes - ITEM_FRAME_OVERHEAD

    @classmethod
    def from_options(cls, options: Mapping[str, str], prefix: str = "hazelcast.") -> GridSettings:
        """Parse ``hazelcast.*`` options (case-insensitive keys, string values). Other keys are ignored.

        Raises:
            ConfigError: an unknown ``hazelcast.*`` key, or a value of the wrong type.
        """
        values: dict[str, Any] = {}
        types = {f.name: f.type for f in fields(cls)}
        for raw_key, raw_value in options.items():
            key = raw_key.lower()
            if not key.startswith(prefix):
                continue
            name = key[len(prefix) :]
            if name not in cls._OPTION_NAMES:
                public = [doc[0] for doc in cls.OPTION_DOCS]
                raise unknown_option("option", raw_key, public)
            attr = cls._OPTION_NAMES[name]
            values[attr] = _convert(raw_key, str(raw_value), types[attr])
        return cls(**values)

    def with_address(self, address: str) -> GridSettings:
        """The same settings pointed at one ``host:port``."""
        return replace(self, members=(address,))

    def client_config(self) -> dict[str, Any]:
        """Keyword arguments for ``hazelcast.HazelcastClient``."""
        config: dict[str, Any] = {
            "cluster_members": list(self.members),
            "cluster_name": self.cluster_name,
            "cluster_connect_timeout": self.connect_timeout_s,
            "invocation_timeout": self.invocation_timeout_s,
            "smart_routing": self.smart_routing,
        }
        if self.username is not None:
            config["creds_username"] = self.username
            config["creds_password"] = self.password
        if self.ssl_enabled:
            config.update(
                ssl_enabled=True,
                ssl_cafile=self.ssl_cafile,
                ssl_certfile=self.ssl_certfile,
                ssl_keyfile=self.ssl_keyfile,
                ssl_password=self.ssl_password,
                ssl_check_hostname=self.ssl_check_hostname,
            )
        return config


def split_members(members: str | Sequence[str]) -> tuple[str, ...]:
    """``"a:5701,b:5701"`` or ``["a:5701", "b:5701"]`` (or a mix) -> ``("a:5701", "b:5701")``.

    Every entry point (Spark option, TOML, environment, ``Grid.connect``, ``GridSettings``) takes a comma-separated
    members string, so they all go through this one function.
    """
    parts = [members] if isinstance(members, str) else list(members)
    out: list[str] = []
    for part in parts:
        if not isinstance(part, str):
            raise ConfigError(f"hazelcast.members: {part!r} is not a host:port string; write it like 127.0.0.1:5701")
        out.extend(piece.strip() for piece in part.split(",") if piece.strip())
    return tuple(out)


def _convert(option: str, value: str, annotation: Any) -> Any:
    text = str(annotation)
    if "tuple" in text:
        return split_members(value)
    if "bool" in text:
        lowered = value.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise ConfigError(f"option {option!r}: expected true or false, got {value!r}")
    if text == "int":
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"option {option!r}: expected an integer, got {value!r}") from None
    if "float" in text:
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"option {option!r}: expected a number of seconds, got {value!r}") from None
    return value


_TLS_FILES = (
    ("hazelcast.ssl.cafile", "ssl_cafile", "the CA bundle that verifies the members"),
    ("hazelcast.ssl.certfile", "ssl_certfile", "the client certificate"),
    ("hazelcast.ssl.keyfile", "ssl_keyfile", "the client's private key"),
)


def check_tls_files(settings: GridSettings) -> None:
    """Each TLS file named must be a readable file, checked before connecting: the client would otherwise fail
    every attempt alike until its connect timeout, as if no member were running."""
    for option, attribute, what in _TLS_FILES:
        path = getattr(settings, attribute)
        if path is None:
            continue
        if not os.path.isfile(path):
            raise ConfigError(f"{option} {path!r}: no such file; give the path of {what} (a PEM file)")
        if not os.access(path, os.R_OK):
            raise ConfigError(f"{option} {path!r}: not readable by this user; it holds {what}")
