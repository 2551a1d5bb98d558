"""`import store_helpers` as mypy sees it: pytest puts tests/store on sys.path at run time; mypy checks the file as
tests.store.store_helpers (see [tool.mypy] in pyproject.toml)."""

from tests.store.store_helpers import *
