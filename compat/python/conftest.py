import pytest

from common import ddl


@pytest.fixture(scope="session", autouse=True)
def compat_schema():
    """Every table lives in schema compat_py, schema-qualified, so a
    search_path leaked by another client cannot change what it names."""
    ddl("create schema if not exists compat_py")
