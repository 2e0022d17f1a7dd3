"""The PostgreSQL and S3 twins of unit tests: every test of a unit module that takes a database or a blob store
(directly or through a fixture) runs again on the real servers in tests/integration. A twin module takes them
all with `globals().update(twins(unit_module, {...}))`, so a test added to the unit module is never left out."""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any

from _pytest.fixtures import FixtureFunctionDefinition

from tests.fixtures import services


def twins(unit_module: ModuleType, service_fixtures: set[str]) -> dict[str, Any]:
    """The tests of `unit_module` whose fixtures reach one of `service_fixtures`, with the module's own fixtures
    and marks (what those tests need to run in another module)."""
    own_fixtures = {
        name: value
        for name, value in vars(unit_module).items()
        if isinstance(value, FixtureFunctionDefinition)
    }
    taken = {
        name: test
        for name, test in vars(unit_module).items()
        if name.startswith("test_")
        and callable(test)
        and _reaches(test, unit_module, service_fixtures, set())
    }
    marks = {"pytestmark": unit_module.pytestmark} if hasattr(unit_module, "pytestmark") else {}
    return {**own_fixtures, **marks, **taken}


def _reaches(function: Any, module: ModuleType, targets: set[str], seen: set[str]) -> bool:
    for name in inspect.signature(function).parameters:
        if name in targets:
            return True
        if name in seen:
            continue
        seen.add(name)
        fixture = getattr(module, name, None) or getattr(services, name, None)
        if isinstance(fixture, FixtureFunctionDefinition) and _reaches(
            fixture._get_wrapped_function(), module, targets, seen
        ):
            return True
    return False
