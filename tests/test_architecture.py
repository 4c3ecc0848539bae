"""docs/architecture.md stays true: its module table is what the code's imports give (tests/_architecture.py),
no module-level import cycle exists, and every module says what it is for."""
from __future__ import annotations

from _architecture import doc_table, floors, imports, modules, purpose, table


def test_no_import_cycles_and_every_module_says_what_it_is_for():
    known = modules()
    floors(imports(known))                 # raises on a cycle
    assert [m for m, p in known.items() if not purpose(p)] == []


def test_the_docs_module_table_is_the_codes():
    assert doc_table() == table(), "regenerate it: .venv/bin/python tests/_architecture.py --write"
