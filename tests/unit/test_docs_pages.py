"""Every page in docs/ reads from its start: a title and an opening before its first section,
numbered sections from 1 without a gap, and a printed table only after the command that prints
it (docs/cost-tutorial.md once began mid-page, at the sweep's table, and at section 3)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = sorted((Path(__file__).resolve().parents[2] / "docs").glob("*.md"))
#: The box-drawing corner rich opens a console table with: a command's printed output.
TABLE_CORNER = "┏"


def _sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of each '## ' section, the part before the first one as ('', body)."""
    parts = re.split(r"^(## .*)$", text, flags=re.MULTILINE)
    return [("", parts[0])] + list(zip(parts[1::2], parts[2::2]))


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_a_page_opens_with_its_title_and_an_opening(page):
    text = page.read_text()
    assert text.startswith("# "), f"{page.name} does not open with a '# ' title"
    opening = _sections(text)[0][1].split("\n", 1)[1]
    assert opening.strip(), f"{page.name} has no opening between its title and its first section"


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_numbered_sections_count_from_one(page):
    numbers = [int(n) for n in re.findall(r"^## (\d+)\.", page.read_text(), flags=re.MULTILINE)]
    assert numbers == list(range(1, len(numbers) + 1)), f"{page.name} numbers its sections {numbers}"


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_a_printed_table_follows_the_command_that_prints_it(page):
    for heading, body in _sections(page.read_text()):
        before = body.split(TABLE_CORNER)[0]
        if TABLE_CORNER in body:
            assert "autoplan " in before, f"{page.name} {heading or 'opening'}: a table without its command"
