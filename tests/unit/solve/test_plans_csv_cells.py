"""plans.csv's configuration cells (solve/outputs.py, _config_cells): a configuration's value under each
column, '' where it has none, whether it holds every column or lacks some."""

from __future__ import annotations

import pytest

from autoplan.solve.outputs import CONFIG_COLUMNS, _config_cells


@pytest.mark.parametrize(
    "config",
    [
        {name: i for i, name in enumerate(CONFIG_COLUMNS)},
        {name: i for i, name in enumerate(CONFIG_COLUMNS) if name != "cp_variant"},
        {"dp": 8, "tp": 2, "zero": 0, "schedule": "1f1b", "recompute": None},
        {"dp": 0, "sp": False, "extra": "ignored"},
        {},
    ],
)
def test_cells_are_the_configuration_values_or_blank(config):
    cells = _config_cells(CONFIG_COLUMNS)
    assert cells(config) == tuple(config.get(name, "") for name in CONFIG_COLUMNS)
