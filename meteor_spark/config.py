"""Connection settings and stream defaults from a TOML file, environment variables and flags.

Precedence, highest first:

1. explicit overrides (the ``meteor`` command's flags, or a caller's ``overrides=``),
2. environment variables (``METEOR_HAZELCAST_MEMBERS``, ``METEOR_CLUSTER_NAME``, ... — see ``ENV_VARS``),
3. the TOML file named by ``--config PATH`` or, when no path is given, by ``METEOR_CONFIG``,
4. the defaults of ``GridSettings`` (the grid on this machine, ``127.0.0.1:5701``, cluster ``dev``).

No file is read implicitly (not even ``./conf/meteor.toml``): a command that behaves differently depending on the
directory it is run from is a trap, and ``conf/`` holds examples to copy. Point at a file explicitly.

The file uses the same vocabulary as the Spark connector's ``hazelcast.*`` options, so one set of names works
everywhere::

    [hazelcast]
    members = ["10.0.0.5:5701", "10.0.0.6:5701"]
    clusterName = "prod"

    [hazelcast.ssl]
    enabled = true
    cafile = "ca.pem"            # relative paths are relative to the TOML file

    [stream]                     # defaults for streams this tool creates (StreamConfig fields)
    lanes = 4
    capacity = 100000

    [server]                     # defaults for `meteor grid start` (its long option names)
    port = 5701

Unknown sections and keys are rejected with the closest known name.
"""

from __future__ import annotations

import logging
import os
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from meteor_spark.errors import ConfigError, unknown_option
from meteor_spark.grid.client import GridSettings

if TYPE_CHECKING:  # pragma: no cover
    from meteor_spark.grid.streams import StreamConfig
logger = logging.getLogger(__name__)

#: Environment variable naming the TOML file when no explicit path is given.
CONFIG_ENV = "METEOR_CONFIG"

#: Environment variable -> ``hazelcast.*`` option it sets.
ENV_VARS: Mapping[str, str] = MappingProxyType(
    {
        "METEOR_HAZELCAST_MEMBERS": "hazelcast.members",
        "METEOR_CLUSTER_NAME": "hazelcast.clusterName",
        "METEOR_USERNAME": "hazelcast.username",
        "METEOR_PASSWORD": "hazelcast.password",
        "METEOR_SSL_ENABLED": "hazelcast.ssl.enabled",
        "METEOR_SSL_CAFILE": "hazelcast.ssl.cafile",
        "METEOR_SSL_CERTFILE": "hazelcast.ssl.certfile",
        "METEOR_SSL_KEYFILE": "hazelcast.ssl.keyfile",
        "METEOR_SSL_PASSWORD": "hazelcast.ssl.password",
        "METEOR_SSL_CHECK_HOSTNAME": "hazelcast.ssl.checkHostname",
        "METEOR_CONNECT_TIMEOUT": "hazelcast.connectTimeout",
        "METEOR_INVOCATION_TIMEOUT": "hazelcast.invocationTimeout",
    }
)

#: Top-level TOML tables and what they hold.
SECTIONS: Mapping[str, str] = MappingProxyType(
    {
        "hazelcast": "how to reach the grid (the Spark connector's hazelcast.* options)",
        "stream": "defaults for streams created by the meteor tools (StreamConfig fields)",
        "server": "defaults for `meteor grid start` (its long option names)",
    }
)

# Options holding file names: relative values are resolved against the TOML file's directory.
_PATH_OPTIONS = frozenset({"hazelcast.ssl.cafile", "hazelcast.ssl.certfile", "hazelcast.ssl.keyfile"})


@dataclass(frozen=True)
class StreamDefaults:
    """Defaults for the streams the tools create, as ``StreamConfig`` field values.

    Attributes:
        values: field name -> value, only the fields the configuration set (the rest keep StreamConfig's defaults).
    """

    values: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def config(self, name: str, **overrides: Any) -> StreamConfig:
        """A ``StreamConfig`` for ``name``: these defaults, then ``overrides`` (``None`` values are ignored)."""
        from meteor_spark.grid.streams import StreamConfig  # streams loads pyarrow: not for every `meteor` command

        merged = dict(self.values)
        merged.update({k: v for k, v in overrides.items() if v is not None})
        return StreamConfig(name=name, **merged)


@dataclass(frozen=True)
class MeteorSettings:
    """Everything the tools read from the configuration sources.

    Attributes:
        grid: how to reach the grid.
        stream_defaults: defaults for streams the tools create.
        server: defaults for ``meteor grid start`` (long option name with ``-`` as ``_`` -> value).
        path: the TOML file that was read, if any.
    """

    grid: GridSettings = field(default_factory=GridSettings)
    stream_defaults: StreamDefaults = field(default_factory=StreamDefaults)
    server: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    path: Path | None = None


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, str] | None = None,
) -> MeteorSettings:
    """Read the configuration: ``overrides`` > environment > TOML file > defaults.

    Args:
        path: the TOML file; when None, ``$METEOR_CONFIG`` if set, else no file.
        env: the environment to read (``os.environ`` when None).
        overrides: ``hazelcast.*`` options that win over everything (the CLI's flags).

    Raises:
        ConfigError: the file is missing or not TOML, a key is unknown (with a suggestion), or a value is invalid.
    """
    environ = os.environ if env is None else env
    if path is None and environ.get(CONFIG_ENV):
        path = environ[CONFIG_ENV]
    document: dict[str, Any] = {}
    file_path: Path | None = None
    if path is not None:
        file_path = Path(path).expanduser()
        document = _read_toml(file_path)
    for section in document:
        if section not in SECTIONS:
            raise _in_file(file_path, unknown_option("section", section, SECTIONS))
    grid = _grid_settings(document, file_path, environ, overrides)
    stream_defaults = _stream_defaults(document.get("stream", {}), file_path)
    server = document.get("server", {})
    if not isinstance(server, dict):
        raise _in_file(file_path, ConfigError("[server] must be a table, e.g. [server] port = 5701"))
    if file_path is not None:
        logger.debug("read configuration from %s", file_path)
    return MeteorSettings(
        grid=grid,
        stream_defaults=stream_defaults,
        server=MappingProxyType({k.replace("-", "_"): v for k, v in server.items()}),
        path=file_path,
    )


def _grid_settings(
    document: dict[str, Any],
    file_path: Path | None,
    environ: Mapping[str, str],
    overrides: Mapping[str, str] | None,
) -> GridSettings:
    """``GridSettings`` from the file's ``[hazelcast]`` table, then the environment, then ``overrides``, each
    replacing what the one before set (the order ``load_config`` documents). Relative TLS file paths written in the
    file are resolved against the file's folder. Errors name the file."""
    # lower-cased option -> (name as written, value): a later source replaces an earlier one whatever its case
    options: dict[str, tuple[str, str]] = {}
    hazelcast_table = document.get("hazelcast", {})
    if not isinstance(hazelcast_table, dict):
        raise _in_file(file_path, ConfigError("[hazelcast] must be a table, e.g. [hazelcast] members = [...]"))
    for key, value in _flatten("hazelcast", hazelcast_table).items():
        text = _to_option_text(key, value, file_path)
        if key.lower() in _PATH_OPTIONS and file_path is not None:
            text = str((file_path.parent / Path(text).expanduser()).resolve())
        options[key.lower()] = (key, text)
    for variable, option in ENV_VARS.items():
        if environ.get(variable):
            options[option.lower()] = (option, environ[variable])
    for option, value in (overrides or {}).items():
        if value is not None:
            options[option.lower()] = (option, value)
    try:
        return GridSettings.from_options(dict(options.values()))
    except ConfigError as exc:
        raise _in_file(file_path, exc) from None


def grid_options(settings: GridSettings) -> dict[str, str]:
    """The ``hazelcast.*`` options that make the Spark connector reach the same grid as ``settings``."""
    options = {
        "hazelcast.members": ",".join(settings.members),
        "hazelcast.clusterName": settings.cluster_name,
        "hazelcast.connectTimeout": f"{settings.connect_timeout_s:g}",
        "hazelcast.invocationTimeout": f"{settings.invocation_timeout_s:g}",
        "hazelcast.smartRouting": str(settings.smart_routing).lower(),
    }
    if settings.username is not None:
        options["hazelcast.username"] = settings.username
        options["hazelcast.password"] = settings.password or ""
    if settings.ssl_enabled:
        options["hazelcast.ssl.enabled"] = "true"
        options["hazelcast.ssl.checkHostname"] = str(settings.ssl_check_hostname).lower()
        for option, value in (
            ("hazelcast.ssl.cafile", settings.ssl_cafile),
            ("hazelcast.ssl.certfile", settings.ssl_certfile),
            ("hazelcast.ssl.keyfile", settings.ssl_keyfile),
            ("hazelcast.ssl.password", settings.ssl_password),
        ):
            if value is not None:
                options[option] = value
    return options


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(
            f"configuration file {str(path)!r} does not exist; fix the path given to --config or ${CONFIG_ENV} "
            f"(an example is conf/meteor.toml in the source repository)"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"configuration file {str(path)!r} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"configuration file {str(path)!r} cannot be read: {exc.strerror}") from None


def _flatten(prefix: str, table: Mapping[str, Any]) -> dict[str, Any]:
    """``{"ssl": {"enabled": True}}`` under ``hazelcast`` -> ``{"hazelcast.ssl.enabled": True}``."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}.{key}"
        if isinstance(value, dict):
            flat.update(_flatten(name, value))
        else:
            flat[name] = value
    return flat


def _to_option_text(key: str, value: Any, file_path: Path | None) -> str:
    """TOML values as the option strings ``GridSettings.from_options`` parses."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return ",".join(value)
    raise _in_file(
        file_path,
        ConfigError(f"{key}: expected a string, number, boolean or list of strings, got {value!r}"),
    )


def _stream_defaults(table: Any, file_path: Path | None) -> StreamDefaults:
    if not isinstance(table, dict):
        raise _in_file(file_path, ConfigError("[stream] must be a table, e.g. [stream] lanes = 4"))
    if not table:
        return StreamDefaults()
    from meteor_spark.grid.streams import StreamConfig  # streams loads pyarrow: only when a [stream] table is given

    known = [f.name for f in fields(StreamConfig) if f.name != "name"]
    for key in table:
        if key not in known:
            raise _in_file(file_path, unknown_option("stream setting", key, known))
    defaults = StreamDefaults(MappingProxyType(dict(table)))
    try:
        defaults.config("config-check")  # StreamConfig validates; fail at load time, not at first use
    except ConfigError as exc:
        raise _in_file(file_path, ConfigError(f"[stream] {exc}")) from None
    except TypeError as exc:
        raise _in_file(file_path, ConfigError(f"[stream] has a value of the wrong type: {exc}")) from None
    return defaults


def _in_file(file_path: Path | None, exc: ConfigError) -> ConfigError:
    if file_path is None:
        return exc
    return type(exc)(f"{file_path}: {exc}")


#: The Spark defaults shipped inside the package (``spark-defaults.conf``, ``log4j2.properties``): present in a
#: wheel install as in a checkout, so ``meteor demo``, the notebook and the Spark bench start quiet everywhere.
CONF_DIR = Path(__file__).resolve().parent / "conf"


def spark_conf(conf_dir: Path | None = None) -> dict[str, str]:
    """The packaged Spark defaults as a dict, for ``SparkSession.builder.config(map=spark_conf())``, with
    ``spark.pyspark.python`` set to the interpreter Python workers run (``workers_python``: this one, unless
    ``$PYSPARK_PYTHON`` says otherwise).

    ``conf_dir`` (default: the package's own ``CONF_DIR``) holds ``spark-defaults.conf`` (``key value`` lines,
    ``#`` comments) and ``log4j2.properties``; the latter becomes the driver's logging configuration
    (``spark.driver.extraJavaOptions=-Dlog4j2.configurationFile=...``), which only takes effect when the session
    starts its JVM (the first ``getOrCreate()`` of the process).

    Raises:
        ConfigError: the directory has no ``spark-defaults.conf``, or a line is not ``key value``.
    """
    directory = CONF_DIR if conf_dir is None else Path(conf_dir)
    defaults_file = directory / "spark-defaults.conf"
    try:
        text = defaults_file.read_text()
    except OSError as exc:
        raise ConfigError(f"Spark defaults {str(defaults_file)!r} cannot be read: {exc.strerror}") from None
    settings: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        parts = stripped.split(None, 1)
        if len(parts) != 2:
            raise ConfigError(f"{defaults_file}:{number}: expected 'key value', got {stripped!r}")
        settings[parts[0]] = parts[1].strip()
    log4j = directory / "log4j2.properties"
    if log4j.is_file() and "spark.driver.extraJavaOptions" not in settings:
        settings["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile={log4j.as_uri()}"
    settings.setdefault("spark.pyspark.python", workers_python())
    return settings


def workers_python() -> str:
    """The interpreter Spark's Python workers will run: ``$PYSPARK_PYTHON``, set to this interpreter when unset.

    Unset, Spark would start ``python3`` from the PATH, which often lacks this package (a virtualenv that is not
    activated, a wheel installed into one interpreter): every read then fails with a long Java trace that never
    names the cause. Set here, before the session starts its JVM, both Spark's JVM (which inherits the
    environment) and PySpark's driver side run the interpreter that runs this program.
    """
    if not os.environ.get("PYSPARK_PYTHON"):
        os.environ["PYSPARK_PYTHON"] = sys.executable
    return os.environ["PYSPARK_PYTHON"]
