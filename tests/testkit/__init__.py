"""Helpers shared by the test modules (importable as ``testkit`` from any test: pytest puts
``tests/`` on the path through its root ``conftest.py``). Fixtures live in ``conftest.py``."""
