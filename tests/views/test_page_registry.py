"""One page registry (views/pages.py): every page is one row, and whatever reads a page's identity reads it there."""

import dataclasses
import re
from pathlib import Path

import pytest

from views import handout, pages

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def test_every_row_is_a_page_with_its_own_slug_title_and_file():
    assert len({p.slug for p in pages.ALL}) == len({p.title for p in pages.ALL}) == len({p.file for p in pages.ALL}) == len(pages.ALL)
    for p in pages.ALL:
        assert (ROOT / p.file).is_file(), p.file
        assert re.fullmatch(r"[a-z-]*", p.slug) and p.icon.startswith(":material/")
    assert [p.number for p in pages.STAGES[1:]] == list(range(1, len(pages.STAGES)))  # the article's order
    on_disk = {f"views/stages/{f.name}" for f in (ROOT / "views" / "stages").glob("*.py") if f.name != "__init__.py"}
    assert on_disk == {p.file for p in pages.ALL}, "a page script that no row names (or a row without its script)"


def test_the_handout_computes_exactly_the_rows_that_say_so():
    assert set(handout.SECTIONS) == {p.slug for p in pages.STAGES if p.handout is not None}
    assert {p.handout for p in pages.ALL} <= {None, "trace", "run"}


def test_no_page_spells_its_own_title_or_number():
    """The heading is drawn from the row (views/header.py); a page script that prints its own title or another
    page's number-and-title would go stale at a rename."""
    for p in pages.ALL:
        src = (ROOT / p.file).read_text()
        assert "st.title(" not in src, p.file
        for other in pages.STAGES[1:]:
            assert f'"{other.title}' not in src, (p.file, other.title)


def test_a_renamed_and_renumbered_page_keeps_its_place_everywhere():
    """A rename is one edit: the title, the short label, the heading and the handout section all follow the row."""
    kv = pages.BY_SLUG["kv-cache"]
    moved = dataclasses.replace(kv, number=21, name="Keys and values, kept")
    assert moved.title == "21 · Keys and values, kept" and moved.short == "21" and moved.h1 == "21 · The KV cache"
    assert moved.file == kv.file and handout.SECTIONS[moved.slug] is handout.SECTIONS["kv-cache"]


def test_neighbours_follow_the_article():
    first, second, last = pages.STAGES[0], pages.STAGES[1], pages.STAGES[-1]
    assert pages.neighbours(first) == (None, second)
    assert pages.neighbours(last)[1] is None
    assert pages.neighbours(pages.OPERATOR) == (None, None)
