"""Prompt files: one reader for the reference benchmark and the live SGLang one, so both measure
the same prompts."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import BadText, read_text_file


def read_prompts(path) -> list[str]:
    """JSONL with a ``prompt`` field per line, or plain text with one prompt per line.

    The format is decided by the content, not the file name: a ``.json`` file of JSONL
    lines would otherwise be benchmarked as its raw JSON strings.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no prompts file at {path}")
    lines = [l for l in read_text_file(path, "prompts file").splitlines() if l.strip()]
    jsonl = path.suffix in (".jsonl", ".json") or (bool(lines) and lines[0].lstrip().startswith("{"))
    if not jsonl:
        prompts = lines
    else:
        prompts = []
        for n, line in enumerate(lines, 1):
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise BadText(f"{path}:{n}: not a JSON line ({exc.msg}); expected {{\"prompt\": \"...\"}} "
                                 "per line, or use a .txt file with one prompt per line") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
                raise BadText(f"{path}:{n}: expected an object with a string 'prompt' field, got "
                              f"{type(obj).__name__} {sorted(obj) if isinstance(obj, dict) else ''}".rstrip())
            prompts.append(obj["prompt"])
    if not prompts:
        raise BadText(f"{path} holds no prompts")
    return prompts
