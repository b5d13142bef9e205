"""docs/sql is what each writer sends: compiled from the statements, compared here."""

from __future__ import annotations

import pytest

from tests.support.sql_docs import DOCS, render

RENDERED = render()


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_the_docs_show_the_sql_as_sent(name):
    assert (DOCS / name).read_text() == RENDERED[name], "rewrite them: python -m tests.support.sql_docs"
