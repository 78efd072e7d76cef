"""plans.csv's configuration cells (solve/outputs.py, _config_rows): each configuration's value under each
column, '' where it has none, whether every configuration holds every column or some lack one, and the
optional columns shown only where some configuration leaves their default (_shown_at_non_default)."""

from __future__ import annotations

import pytest

from autoplan.solve.outputs import CONFIG_COLUMNS, OPTIONAL_COLUMNS, _config_rows, _shown_at_non_default

CONFIGS = [
    {name: i for i, name in enumerate(CONFIG_COLUMNS)},
    {name: i for i, name in enumerate(CONFIG_COLUMNS) if name != "cp_variant"},
    {"dp": 8, "tp": 2, "zero": 0, "schedule": "1f1b", "recompute": None},
    {"dp": 0, "sp": False, "extra": "ignored"},
    {},
]


@pytest.mark.parametrize("config", CONFIGS)
def test_cells_are_the_configuration_values_or_blank(config):
    full = {name: f"v{i}" for i, name in enumerate(CONFIG_COLUMNS)}
    for configs in ([config], [full, config], [config, full]):  # the one lacking a column first, last or alone
        assert _config_rows(configs, CONFIG_COLUMNS) == [
            tuple(c.get(name, "") for name in CONFIG_COLUMNS) for c in configs
        ]


def test_optional_columns_are_shown_where_some_configuration_leaves_their_default():
    (name, default), *_ = OPTIONAL_COLUMNS
    assert _shown_at_non_default([{}, {name: default}]) == ()
    assert name in _shown_at_non_default([{}, {name: "*"}, {name: default}])  # a pruned group's '*' too
    assert name in _shown_at_non_default([{name: default + 1}])
