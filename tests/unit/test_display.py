"""What autoplan prints: tables never cut a number off at 80 or 120 columns (or piped), and the
numbers read in sensible units (autoplan/display.py)."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console
from synthetic import a100_profile, synthetic_gpt

from autoplan.display import FitTable, duration_text, number_text, si_text
from autoplan.solve.api import plan_graph
from autoplan.solve.console import top_table

NUMBER = re.compile(r"[0-9][0-9.,%]*")


def rendered(renderable, width: int) -> str:
    console = Console(width=width, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.file.getvalue()


def assert_numbers_whole(table: FitTable, text: str) -> None:
    """Every number cell appears as one unbroken token, and nothing ends in an ellipsis."""
    assert "…" not in text
    tokens = set(NUMBER.findall(text))
    numeric = [i for i, h in enumerate(table.headers) if h in table.numbers]
    for row in table.rows:
        for i in numeric:
            assert row[i] in tokens, f"{table.headers[i]} = {row[i]} was cut: {text}"


@pytest.fixture(scope="module")
def search():
    graph = synthetic_gpt(layers=8, hidden=4096, heads=32, batch=128, seq=2048)
    return plan_graph(graph, devices=64, profile=a100_profile(), batch_size=128)


@pytest.mark.parametrize("width", [80, 120, 160])
def test_the_plan_table_prints_every_number_whole(search, width):
    table = top_table(search, top_k=5)
    text = rendered(table, width)
    assert_numbers_whole(table, text)
    for c in search.ranked()[:5]:  # every plan is printed, wrapped at spaces if need be
        assert c.plan.describe().split() == [w for w in c.plan.describe().split() if w in text.split()]


def test_the_plan_table_names_terms_as_the_docs_do(search):
    table = top_table(search, top_k=5)
    assert not [h for h in table.headers if h.endswith("_s")]
    assert table.headers[2] == "step ms"  # the best step of this model is 0.1-1 s


def test_a_narrow_terminal_turns_the_table_then_lists_it(search):
    table = top_table(search, top_k=5)
    assert table.layout(200) == "rows" and table.layout(80) in ("rows", "columns")
    assert table.layout(30) == "records"
    for width in (50, 30):
        assert_numbers_whole(table, rendered(table, width))


def test_fit_table_rows_must_match_headers():
    table = FitTable(headers=["a", "b"], numbers={"b"})
    with pytest.raises(ValueError, match="2 headers"):
        table.add_row("1")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(4.017e-08, "40.2 ns"), (2.5e-05, "25.0 µs"), (0.1182345, "118 ms"), (1.3612, "1.36 s"), (1182.3, "1182 s")],
)
def test_durations_read_in_a_sensible_unit(seconds, text):
    assert duration_text(seconds) == text


def test_numbers_keep_three_figures_and_no_exponent():
    assert [number_text(v) for v in (1182.34, 12.345, 0.04017, 0.0)] == ["1182", "12.3", "0.0402", "0"]


def test_counts_read_with_an_si_prefix():
    assert si_text(4.278e8, "FLOP") == "428 MFLOP" and si_text(2.039e12, "B/s") == "2.04 TB/s"


def test_cells_are_text_not_markup():
    table = FitTable(headers=["what", "value"], numbers=set())
    table.add_row("[bold]stages[/bold]", "[0, 1]")
    assert "[bold]stages[/bold]" in rendered(table, 80) and "[0, 1]" in rendered(table, 80)
