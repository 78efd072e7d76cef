"""Puts tests/ on the import path, so every tier imports the one fixtures module, ``synthetic``."""

import os

import pytest

# The trace cache (autoplan/trace/cache.py) stays off in tests, so each test traces what it means to
# trace; tests/unit/trace/test_trace_cache.py turns it on in a temporary folder.
os.environ["AUTOPLAN_TRACE_CACHE"] = "off"
os.environ["AUTOPLAN_SEARCH_CACHE"] = "off"  # the search cache (cost/stored.py): only where a test attaches one

# The search runs in one process (``plan --jobs``' default reads AUTOPLAN_JOBS): the suite's workers already take
# every core (-n auto), and a search that forks inside one would only compete with them. The search on several
# processes is tested where a test asks for it (tests/unit/solve/test_shares.py).
os.environ["AUTOPLAN_JOBS"] = "1"

# pytest-xdist's workers start with COLUMNS=80, which the CLI takes for a terminal's width
# (solve/console.py); the tests read its tables as printed to a pipe (160 columns), as without xdist.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (the README's ``-n auto --dist loadgroup``) every multi-process test in tests/dist
    runs on one worker, one after another, as without xdist: their ranks take the machine's cores, they
    share process groups through module fixtures, and the hang tests time heartbeats. The unit tests
    spread over the other workers beside them."""
    multi_process = config.rootpath / "tests" / "dist"
    for item in items:
        if item.path.is_relative_to(multi_process):
            item.add_marker(pytest.mark.xdist_group("dist"))
