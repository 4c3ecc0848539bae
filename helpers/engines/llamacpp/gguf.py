"""What a llama.cpp draft GGUF says it serves: its metadata, read without llama.cpp or the ``gguf`` package.

llama.cpp fixes an EAGLE-3 draft's ids when the draft is converted (``convert_hf_to_gguf.py DRAFT
--target-model-dir TARGET``): the converter writes them as ``eagle3.target_layers`` and the engine uses them
as given, each id the input of that layer, a boundary (docs/conventions.md, "llama.cpp"). The GGUF, not the
Hugging Face config beside it, is therefore what a llama.cpp deployment serves, and ``check --gguf`` reads
it. Only the header and the key/value section are read (the tensors that follow are never touched), so a
multi-gigabyte file costs a few kilobytes.

The layout, GGUF v2 and v3 (little-endian): magic ``GGUF``, uint32 version, uint64 tensor count, uint64
key/value count, then each pair as a uint64-length UTF-8 key, a uint32 value type and the value.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

from ...errors import BadCheckpoint

TARGET_LAYERS_KEY = "eagle3.target_layers"
MAGIC = b"GGUF"
VERSIONS = (2, 3)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
            12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_KEYS = 1 << 20            # far above any real file: a corrupt count fails here, not in memory
_MAX_TEXT = 1 << 26


class GgufError(BadCheckpoint):
    """A file that is not a GGUF the workbook can read, or lacks what llama.cpp's EAGLE-3 needs."""


def read_metadata(path: str | Path) -> dict:
    """Every key/value pair of a GGUF file's header, in file order (arrays as lists)."""
    path = Path(path)
    try:
        f = path.open("rb")
    except OSError as exc:
        raise GgufError(f"cannot read {path} ({exc.strerror or type(exc).__name__}); expected a GGUF "
                        f"file written by llama.cpp's convert_hf_to_gguf.py") from None
    with f:
        head = f.read(4)
        if head != MAGIC:
            raise GgufError(f"{path} is not a GGUF file (it starts with {head!r}, not b'GGUF'); expected "
                            f"the draft as llama.cpp's convert_hf_to_gguf.py wrote it")
        version, = _unpack(f, "<I", path)
        if version not in VERSIONS:
            raise GgufError(f"{path} is GGUF version {version}; the workbook reads versions "
                            f"{', '.join(map(str, VERSIONS))}")
        _tensors, count = _unpack(f, "<QQ", path)
        if count > _MAX_KEYS:
            raise GgufError(f"{path} claims {count} metadata keys: a corrupt or truncated header")
        meta = {}
        for _ in range(count):
            key = _text(f, path)
            kind, = _unpack(f, "<I", path)
            meta[key] = _value(f, kind, path, key)
    return meta


def target_layers(path: str | Path) -> list[int]:
    """The draft's ``eagle3.target_layers``: the boundaries llama.cpp feeds its fc, in the file's order."""
    meta = read_metadata(path)
    got = meta.get(TARGET_LAYERS_KEY)
    if got is None:
        arch = meta.get("general.architecture")
        raise GgufError(f"{path} has no {TARGET_LAYERS_KEY} (general.architecture {arch!r}); expected an "
                        f"EAGLE-3 draft converted with --target-model-dir by a llama.cpp build that has "
                        f"EAGLE-3 (b10001 or later)")
    if not isinstance(got, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in got):
        raise GgufError(f"{path}: {TARGET_LAYERS_KEY} is {got!r}; expected a list of layer indices")
    return got


def _unpack(f: BinaryIO, fmt: str, path: Path) -> tuple:
    size = struct.calcsize(fmt)
    raw = f.read(size)
    if len(raw) != size:
        raise GgufError(f"{path} ends inside its metadata header (truncated or partly copied?)")
    return struct.unpack(fmt, raw)


def _text(f: BinaryIO, path: Path) -> str:
    n, = _unpack(f, "<Q", path)
    if n > _MAX_TEXT:
        raise GgufError(f"{path}: a metadata string of {n} bytes: a corrupt header")
    raw = f.read(n)
    if len(raw) != n:
        raise GgufError(f"{path} ends inside its metadata header (truncated or partly copied?)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise GgufError(f"{path}: a metadata string is not UTF-8: a corrupt header") from None


def _value(f: BinaryIO, kind: int, path: Path, key: str):
    if kind in _SCALARS:
        return _unpack(f, _SCALARS[kind], path)[0]
    if kind == _STRING:
        return _text(f, path)
    if kind == _ARRAY:
        inner, n = _unpack(f, "<IQ", path)
        if n > _MAX_TEXT:
            raise GgufError(f"{path}: {key} claims {n} items: a corrupt header")
        return [_value(f, inner, path, key) for _ in range(n)]
    raise GgufError(f"{path}: {key} has value type {kind}, which no GGUF version defines (a corrupt header)")
