"""docs/architecture.md stays true: its module table is what the code's imports give (tests/_architecture.py),
no module-level import cycle exists, and every module says what it is for."""
from __future__ import annotations

from _architecture import (
    LARGEST_MODULE,
    LONG_FUNCTION,
    cycles,
    doc_table,
    floors,
    imports,
    modules,
    purpose,
    sizes,
    table,
)


def test_no_import_cycles_and_every_module_says_what_it_is_for():
    known = modules()
    floors(imports(known))                 # raises on a cycle
    assert [m for m, p in known.items() if not purpose(p)] == []


# Groups of modules allowed to reach each other through imports inside functions, each with its reason.
ALLOWED_CYCLES: dict[tuple[str, ...], str] = {}


def test_no_cycle_even_counting_imports_inside_functions():
    """A lazy import is still a dependency, and so is every package an import runs (``from helpers.rules
    import x`` runs ``helpers/rules/__init__.py``): counted both ways, helpers/ has no cycle. ``Engine.rules``
    reaches the engine rooms by registration (``conventions.rules_of`` loads ``rules.families`` by name on
    first use, which registers), not by importing up."""
    found = {tuple(g): g for g in cycles(imports(modules()))}
    assert set(found) <= set(ALLOWED_CYCLES), [g for k, g in found.items() if k not in ALLOWED_CYCLES]


def test_short_functions_and_modules():
    """A function does one job and a module holds one concern: none over the limits docs/architecture.md's
    last line states (the split is by job: decide, then render)."""
    size = sizes()
    assert size["long_functions"] == [], f"over {LONG_FUNCTION} lines: {size['long_functions']}"
    assert size["largest_lines"] <= LARGEST_MODULE, (size["largest"], size["largest_lines"])


def test_the_docs_module_table_is_the_codes():
    assert doc_table() == table(), "regenerate it: .venv/bin/python tests/_architecture.py --write"


# The folders top to bottom as docs/architecture.md draws them; everything else (cli, boundaries, record,
# errors, progress) sits at the bottom, except cli, drawn at the top, which parses --engine. An engine's
# folder (engines/<name>/) spans the floors: each of its modules sits on the floor of the highest shared
# folder it reaches, so the rule modules stay beside rules/ and the live ones beside live/.
FOLDERS = ["commands", "notebook", "live", "factory", "investigation", "model", "rules"]
EXCEPTIONS = {("helpers.cli", "helpers.rules.conventions"), ("helpers.cli", "helpers.rules")}  # + its package


def places(graph) -> dict[str, int]:
    """Each module's folder in FOLDERS' order (its index; len(FOLDERS) for the bottom)."""
    out: dict[str, int] = {}

    def place(m: str) -> int:
        if m in out:
            return out[m]
        part = m.split(".")[1] if m.count(".") else ""
        if part == "engines":
            out[m] = len(FOLDERS)           # provisional, against a cycle (none exists: tested above)
            top, lazy = graph[m]
            out[m] = min([place(d) for d in top | lazy] + [len(FOLDERS)])
        else:
            out[m] = FOLDERS.index(part) if part in FOLDERS else len(FOLDERS)
        return out[m]

    for m in graph:
        place(m)
    return out


def test_imports_between_folders_point_down_the_picture():
    graph = imports(modules())
    place = places(graph)
    up = {(m, d) for m, (top, lazy) in graph.items() for d in top | lazy if place[d] < place[m]}
    assert up == EXCEPTIONS


def test_each_engine_is_one_folder():
    """What differs by engine lives in its folder: no engine's name is a module or folder elsewhere (a
    command is named by what the user types: ``llamacpp-build`` is ``commands.llamacpp``)."""
    known = modules()
    engines = {m.split(".")[2] for m in known if m.startswith("helpers.engines.") and m.count(".") >= 2}
    assert engines >= {"sglang", "vllm", "llamacpp", "trtllm"}
    elsewhere = [m for m in known if not m.startswith(("helpers.engines", "helpers.commands."))
                 and engines & set(m.split(".")[1:])]
    assert elsewhere == []
