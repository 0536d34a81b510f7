"""Test kits for the suites of MGit's backends and of code built on MGit: `mgit.testing.store`
is the object store contract as a test class that each `ObjectStore`'s tests subclass (as
zarr ships `zarr/testing/store.py`).

These modules import pytest (`pip install 'mgit-models[testing]'`); nothing else in mgit
imports them, so the package itself never needs pytest. Nothing is imported here.
"""
