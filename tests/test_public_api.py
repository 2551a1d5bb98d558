"""The public surface is small, curated and real: every name in ``meteor_spark.__all__`` resolves, nothing else
leaks, and the names a user reaches for first are there."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import pytest

import meteor_spark

ERRORS = {
    "ArgumentTypeError",
    "ConfigError",
    "DataLossError",
    "DeserializationError",
    "DuplicateMessageError",
    "FencedError",
    "FormatError",
    "GridConnectionError",
    "GridError",
    "GridOperationError",
    "GroupError",
    "IncompatibleSchemaError",
    "LaneTruncatedError",
    "MeteorError",
    "NotAssignedError",
    "OffsetOutOfRangeError",
    "PublishTimeoutError",
    "PublisherClosedError",
    "RedriveError",
    "RequestError",
    "RequestTimeoutError",
    "SerializationError",
    "SizeLimitError",
    "StreamConfigConflictError",
    "StreamDeletedError",
    "StreamNotFoundError",
    "TransactionAbortedError",
    "UnsupportedFormatVersionError",
}

EXPECTED = ERRORS | {
    "ConfigError",
    "DataLossError",
    "EmbeddedGrid",
    "EnsureResult",
    "Grid",
    "GridConnectionError",
    "GridError",
    "GridSettings",
    "GroupMember",
    "InitialOffsetScheme",
    "MeteorDataSource",
    "MeteorError",
    "Publisher",
    "Receiver",
    "Record",
    "RecordBatch",
    "Requester",
    "Responder",
    "SharedRecord",
    "SharedSubscriber",
    "StreamConfig",
    "Subscriber",
    "TransactionalPublisher",
    "__version__",
    "ensure_stream",
    "register",
}


def test_all_is_the_curated_list() -> None:
    assert set(meteor_spark.__all__) == EXPECTED
    assert len(meteor_spark.__all__) == len(set(meteor_spark.__all__))


@pytest.mark.parametrize("name", sorted(EXPECTED - {"__version__"}))
def test_every_exported_name_resolves_to_a_documented_object(name: str) -> None:
    obj = getattr(meteor_spark, name)
    assert inspect.isclass(obj) or callable(obj)
    assert inspect.getdoc(obj), f"meteor_spark.{name} has no docstring"
    # Exported from where it is defined: one obvious home per name.
    assert obj.__module__.startswith("meteor_spark.")


def test_errors_share_one_root() -> None:
    for name in ("ConfigError", "DataLossError", "GridError", "GridConnectionError"):
        assert issubclass(getattr(meteor_spark, name), meteor_spark.MeteorError)
    assert issubclass(meteor_spark.ConfigError, ValueError)  # `except ValueError` keeps working


def test_every_error_of_the_tree_is_exported() -> None:
    import meteor_spark.errors as errors

    defined = {
        name
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, errors.MeteorError) and obj.__module__ == errors.__name__
    }
    assert defined == ERRORS
    for name in ERRORS:
        assert getattr(meteor_spark, name) is getattr(errors, name)


def test_one_error_per_condition_with_the_builtin_base_users_expect() -> None:
    assert issubclass(meteor_spark.ArgumentTypeError, TypeError)
    assert issubclass(meteor_spark.ArgumentTypeError, meteor_spark.ConfigError)
    assert issubclass(meteor_spark.SizeLimitError, ValueError)
    assert not issubclass(meteor_spark.SizeLimitError, meteor_spark.ConfigError)  # no option raises the limit
    assert issubclass(meteor_spark.FencedError, meteor_spark.GroupError)


def test_grouped_users_find_what_they_catch_and_hold() -> None:
    from meteor_spark.groups.exclusive import GroupMember

    assert meteor_spark.GroupMember is GroupMember
    assert inspect.getdoc(GroupMember)


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Publsher'"):
        meteor_spark.Publsher  # noqa: B018


def test_version_is_the_package_version() -> None:
    from importlib.metadata import version

    assert meteor_spark.__version__ == version("meteor-spark")


def test_module_paths_from_before_the_layers_still_import_with_a_deprecation_warning() -> None:
    """``from meteor_spark.subscriber import Subscriber`` (the flat layout's path) gives the same objects as the new
    path, and a warning that names where to import from now; the layers' own paths warn about nothing."""
    script = """
import json, warnings
warnings.filterwarnings("error", message="meteor_spark", category=DeprecationWarning)
import meteor_spark
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.grid import Grid, GridSettings
from meteor_spark.grid.client import Ring
from meteor_spark.groups.exclusive import GroupMember
out = {}
warnings.simplefilter("always", DeprecationWarning)
for old, name in [("meteor_spark.subscriber", "Subscriber"), ("meteor_spark.grid", "Ring"),
                  ("meteor_spark.groups", "GroupMember"), ("meteor_spark.spark.soak", "run")]:
    with warnings.catch_warnings(record=True) as caught:
        module = __import__(old, fromlist=[name])
        value = getattr(module, name)
    out[old] = [value is {"Subscriber": Subscriber, "Ring": Ring, "GroupMember": GroupMember}.get(name, value),
                [str(w.message) for w in caught if str(w.message).startswith("meteor_spark")]]
print(json.dumps(out))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results["meteor_spark.subscriber"] == [
        True,
        ["meteor_spark.subscriber moved to meteor_spark.consumer.subscriber: import it from there"],
    ]
    assert results["meteor_spark.grid"] == [
        True,
        ["meteor_spark.grid.Ring moved to meteor_spark.grid.client.Ring: import it from there"],
    ]
    assert results["meteor_spark.groups"][0] is True
    assert results["meteor_spark.groups"][1] == [
        "meteor_spark.groups.GroupMember moved to meteor_spark.groups.exclusive.GroupMember: import it from there"
    ]
    assert results["meteor_spark.spark.soak"][1] == [
        "meteor_spark.spark.soak moved to meteor_spark.bench.jobs.soak: import it from there"
    ]
