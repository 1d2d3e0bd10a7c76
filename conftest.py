"""Shared test fixtures (tests/fixtures.py) for the product's tests and the tools' tests."""

import os

pytest_plugins = ["tests.fixtures"]

# Servers the tests start as subprocesses serve GE2E by default, as the in-process engine fixture does
# (tests/fixtures.py): the tests' load and memory bounds were measured on it, and it is the cheapest.
# tests/test_fusion.py covers the fusion that `--encoder auto` serves when GE2E and CAM++ are both there.
os.environ.setdefault("SLEUTHD_ENCODER", "ge2e")
