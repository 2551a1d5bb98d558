"""`import deploy_helpers` as mypy sees it: pytest puts tests/deploy on sys.path at run time; mypy checks the file as
tests.deploy.deploy_helpers (see [tool.mypy] in pyproject.toml)."""

from tests.deploy.deploy_helpers import *
