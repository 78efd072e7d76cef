"""Puts tests/ on the import path, so every tier imports the one fixtures module, ``synthetic``."""

import os

# The trace cache (autoplan/trace/cache.py) stays off in tests, so each test traces what it means to
# trace; tests/unit/trace/test_trace_cache.py turns it on in a temporary folder.
os.environ["AUTOPLAN_TRACE_CACHE"] = "off"
