"""Configuration loading: TOML file, environment, overrides, precedence, and the errors users see."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from meteor_spark.config import ENV_VARS, grid_options, load_config
from meteor_spark.errors import ConfigError
from meteor_spark.grid.client import GridSettings

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "meteor.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_no_file_and_no_environment_gives_the_local_grid_defaults() -> None:
    config = load_config(env={})
    assert config.grid == GridSettings()
    assert config.path is None
    assert dict(config.stream_defaults.values) == {}


def test_the_shipped_example_file_loads(tmp_path: Path) -> None:
    config = load_config(REPO / "conf" / "meteor.toml", env={})
    assert config.grid.members == ("127.0.0.1:5701",)
    assert config.grid.cluster_name == "dev"
    assert config.grid.ssl_enabled is False
    assert config.stream_defaults.values["lanes"] == 1
    assert config.server["port"] == 5701


def test_file_values_reach_grid_settings(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [hazelcast]
        members = ["10.0.0.5:5701", "10.0.0.6:5702"]
        clusterName = "prod"
        username = "meteor"
        password = "s3cret"
        connectTimeout = 2.5
        smartRouting = false
        [hazelcast.ssl]
        enabled = true
        cafile = "certs/ca.pem"
        checkHostname = true
        """,
    )
    settings = load_config(path, env={}).grid
    assert settings.members == ("10.0.0.5:5701", "10.0.0.6:5702")
    assert settings.cluster_name == "prod"
    assert (settings.username, settings.password) == ("meteor", "s3cret")
    assert settings.connect_timeout_s == 2.5
    assert settings.smart_routing is False
    assert settings.ssl_enabled is True and settings.ssl_check_hostname is True
    # Relative file names are relative to the TOML file, not to the directory the command runs in.
    assert settings.ssl_cafile == str((tmp_path / "certs" / "ca.pem").resolve())
    assert "s3cret" not in repr(settings)


def test_precedence_is_overrides_then_environment_then_file(tmp_path: Path) -> None:
    path = write(tmp_path, '[hazelcast]\nmembers = "file:1"\nclusterName = "from-file"\nconnectTimeout = 3\n')
    env = {"METEOR_HAZELCAST_MEMBERS": "env:2", "METEOR_CLUSTER_NAME": "from-env"}
    config = load_config(path, env=env, overrides={"hazelcast.clustername": "from-flag"})
    assert config.grid.members == ("env:2",)
    assert config.grid.cluster_name == "from-flag"
    assert config.grid.connect_timeout_s == 3.0


def test_meteor_config_environment_variable_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, '[hazelcast]\nclusterName = "via-env"\n')
    assert load_config(env={"METEOR_CONFIG": str(path)}).grid.cluster_name == "via-env"


def test_every_documented_environment_variable_is_accepted() -> None:
    env = {name: "x" for name in ENV_VARS}
    env.update(
        METEOR_HAZELCAST_MEMBERS="h:1",
        METEOR_SSL_ENABLED="true",
        METEOR_SSL_CHECK_HOSTNAME="false",
        METEOR_CONNECT_TIMEOUT="4",
        METEOR_INVOCATION_TIMEOUT="5",
    )
    settings = load_config(env=env).grid
    assert settings.username == "x" and settings.password == "x" and settings.ssl_enabled
    assert settings.invocation_timeout_s == 5.0


def test_unknown_key_is_rejected_with_a_suggestion_and_the_file_name(tmp_path: Path) -> None:
    path = write(tmp_path, '[hazelcast]\nclustername = "a"\nmembrs = "h:1"\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    message = str(caught.value)
    assert str(path) in message
    assert "hazelcast.membrs" in message and "did you mean 'hazelcast.members'" in message


def test_unknown_section_is_rejected_with_a_suggestion(tmp_path: Path) -> None:
    path = write(tmp_path, "[streams]\nlanes = 2\n")
    with pytest.raises(ConfigError, match=r"unknown section 'streams' \(did you mean 'stream'\?\)"):
        load_config(path, env={})


def test_bad_value_names_the_option(tmp_path: Path) -> None:
    path = write(tmp_path, '[hazelcast]\nmembers = "no-port-here"\n')
    with pytest.raises(ConfigError, match=re.escape("hazelcast.members: 'no-port-here' is not host:port")):
        load_config(path, env={})
    path = write(tmp_path, "[hazelcast]\nmembers = [1, 2]\n", name="b.toml")
    with pytest.raises(ConfigError, match=re.escape("hazelcast.members: expected a string")):
        load_config(path, env={})


def test_missing_and_malformed_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml", env={})
    path = write(tmp_path, "[hazelcast\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_config(path, env={})


def test_stream_defaults_are_validated_and_used(tmp_path: Path) -> None:
    path = write(tmp_path, "[stream]\nlanes = 3\ncapacity = 500\n")
    defaults = load_config(path, env={}).stream_defaults
    config = defaults.config("orders", capacity=None, compression="none")
    assert (config.name, config.lanes, config.capacity, config.compression) == ("orders", 3, 500, "none")

    with pytest.raises(ConfigError, match="did you mean 'lanes'"):
        load_config(write(tmp_path, "[stream]\nlane = 3\n", name="c.toml"), env={})
    with pytest.raises(ConfigError, match=r"\[stream\]"):
        load_config(write(tmp_path, "[stream]\nlanes = 0\n", name="d.toml"), env={})


def test_grid_options_round_trip_through_the_spark_option_parser() -> None:
    settings = GridSettings(
        members=("a:1", "b:2"),
        cluster_name="c",
        username="u",
        password="p",
        ssl_enabled=True,
        ssl_cafile="/ca.pem",
        connect_timeout_s=1.5,
    )
    assert GridSettings.from_options(grid_options(settings)) == settings


def test_a_comma_separated_members_string_is_several_members_at_every_entry_point() -> None:
    expected = ("10.0.0.5:5701", "10.0.0.6:5701")
    assert GridSettings(members="10.0.0.5:5701, 10.0.0.6:5701").members == expected  # type: ignore[arg-type]
    assert GridSettings(members=("10.0.0.5:5701,10.0.0.6:5701",)).members == expected
    assert GridSettings.from_options({"hazelcast.members": "10.0.0.5:5701,10.0.0.6:5701"}).members == expected
    env = {"METEOR_HAZELCAST_MEMBERS": "10.0.0.5:5701,10.0.0.6:5701"}
    assert load_config(env=env).grid.members == expected
    with pytest.raises(ConfigError, match=re.escape("'10.0.0.6' is not host:port")):
        GridSettings(members="10.0.0.5:5701,10.0.0.6")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=re.escape("hazelcast.members is empty")):
        GridSettings(members=" , ")  # type: ignore[arg-type]


def test_grid_connect_tries_each_member_of_a_comma_separated_string(grid_settings: GridSettings) -> None:
    from meteor_spark.grid.client import Grid

    # Port 1 refuses at once; the client moves on to the next member and connects.
    members = ",".join(("127.0.0.1:1",) + grid_settings.members)
    with Grid.connect(members, cluster_name=grid_settings.cluster_name, connect_timeout_s=20) as grid:
        assert grid.settings.members == ("127.0.0.1:1",) + grid_settings.members
        assert grid.members()
