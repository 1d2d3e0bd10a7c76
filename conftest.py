"""Shared test fixtures (tests/fixtures.py) for the product's tests and the tools' tests."""

pytest_plugins = ["tests.fixtures"]
