"""Every text file ``helpers/`` writes or reads names its encoding (UTF-8): without one Python takes the
locale's, so a report with a non-ASCII prompt written under ``LANG=C`` (or read back under another locale)
fails or changes. Read statically from the syntax trees: ``Path.write_text``/``read_text``, ``open`` and
``os.fdopen`` in a text mode."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HELPERS = REPO / "helpers"
# their .open is not a text file's: archives, a browser, os.open (a descriptor from flags), a urllib opener
ARCHIVES = {"tarfile", "gzip", "zipfile", "bz2", "lzma", "webbrowser", "os", "opener"}


def _mode(call: ast.Call, at: int) -> ast.expr | None:
    if len(call.args) > at:
        return call.args[at]
    return next((k.value for k in call.keywords if k.arg == "mode"), None)


def _text_open(call: ast.Call) -> bool:
    """``open``/``os.fdopen``/``<path>.open`` in a text mode (no ``b`` in a mode written out)."""
    f = call.func
    if isinstance(f, ast.Name) and f.id == "open":
        mode = _mode(call, 1)
    elif isinstance(f, ast.Attribute) and f.attr == "fdopen":
        mode = _mode(call, 1)
    elif (isinstance(f, ast.Attribute) and f.attr == "open"
          and not (isinstance(f.value, ast.Name) and f.value.id in ARCHIVES)
          and not (isinstance(f.value, ast.Attribute) and f.value.attr in ARCHIVES)):
        mode = _mode(call, 0)
    else:
        return False
    return not (isinstance(mode, ast.Constant) and isinstance(mode.value, str) and "b" in mode.value)


def unnamed_encodings(source: str) -> list[tuple[int, str]]:
    """(line, call) for each text read or write in ``source`` that names no encoding."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or any(k.arg == "encoding" for k in node.keywords):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        # Path.read_text takes no positional argument but its encoding, Path.write_text only its data:
        # a method of the same name taking others (SglangSource.read_text(rel)) is no file's
        if ((name == "write_text" and len(node.args) == 1) or (name == "read_text" and not node.args)
                or _text_open(node)):
            found.append((node.lineno, ast.unparse(node.func)))
    return found


def test_every_text_file_names_its_encoding():
    missing = {str(p.relative_to(REPO)): hits for p in sorted(HELPERS.rglob("*.py"))
               if (hits := unnamed_encodings(p.read_text(encoding="utf-8")))}
    assert not missing, f"text written or read without encoding=\"utf-8\": {missing}"


def test_the_check_sees_each_form():
    src = ('p.write_text(s)\np.read_text()\nopen(f)\nopen(f, "w")\nos.fdopen(3, "r")\np.open("a")\n'
           'p.write_text(s, encoding="utf-8")\nopen(f, "rb")\ntarfile.open(f)\nsrc.read_text("a/b.py")\n'
           'p.read_text(errors="replace")\n')
    assert [line for line, _ in unnamed_encodings(src)] == [1, 2, 3, 4, 5, 6, 11]
