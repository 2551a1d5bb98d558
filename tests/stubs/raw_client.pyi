"""`import raw_client` as mypy sees it: pytest puts tests/server on sys.path at run time; mypy checks the file as
tests.server.raw_client (see [tool.mypy] in pyproject.toml)."""

from tests.server.raw_client import *
