"""TensorRT-LLM's launch options: the file a user passes to ``trtllm-serve --extra_llm_api_options FILE``
(YAML) or builds the LLM API's arguments from (JSON). Its ``speculative_config`` is where TensorRT-LLM
takes the capture ids from (``EagleDecodingConfig.eagle3_layers_to_capture``, ``tensorrt_llm/llmapi/
llm_args.py``); the draft's config.json is never read for them (docs/conventions.md, "TensorRT-LLM").

Only the keys that decide the wiring are read: ``decoding_type`` (``Eagle3`` or ``Eagle``),
``eagle3_layers_to_capture``, ``eagle3_one_model`` (default true) and ``max_draft_len``. Anything else in the
file is left to TensorRT-LLM. A file that cannot be read, or whose speculative config is not an EAGLE one,
is bad input (``BadConfig``: one line, exit 2).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from ...errors import BadConfig, read_json_file
from ...record import read_record

SPEC_KEY = "speculative_config"
IDS_KEY = "eagle3_layers_to_capture"
DECODING_TYPES = ("Eagle3", "Eagle")
OPTIONS_FILE = "trtllm-options.yaml"      # what ``fixes deploy --engine trtllm`` writes beside the draft


@dataclass(frozen=True)
class TrtllmOptions:
    """What one options file tells TensorRT-LLM about EAGLE-3. ``ids``: ``eagle3_layers_to_capture`` as
    written (None: absent, so the release's default is captured); ``one_model``: ``eagle3_one_model``."""

    path: str
    decoding_type: str
    ids: tuple[int, ...] | None
    one_model: bool = True
    max_draft_len: int | None = None
    speculative_model: str | None = None

    @property
    def mode(self) -> str:
        return "one-model" if self.one_model else "two-model"

    def describe(self) -> str:
        ids = list(self.ids) if self.ids is not None else "absent (the release's default)"
        return (f"{Path(self.path).name}: decoding_type {self.decoding_type}, {IDS_KEY} {ids}, "
                f"eagle3_one_model {str(self.one_model).lower()} ({self.mode})")


def _parse(path: Path) -> object:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadConfig(f"--trtllm-options {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadConfig(f"--trtllm-options {path}: cannot read it ({exc})") from None
    try:
        if path.suffix.lower() == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else (
            f" at line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else "")
        raise BadConfig(f"--trtllm-options {path}: not valid YAML/JSON{at}") from None


def _ids(value: object, path: Path) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple, set)) or not value or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise BadConfig(f"--trtllm-options {path}: {SPEC_KEY}.{IDS_KEY} must be a non-empty list of "
                        f"integer layer ids, got {value!r}")
    return tuple(value)


def read_options(path: str | Path) -> TrtllmOptions:
    """The EAGLE part of a TensorRT-LLM options file (YAML, or JSON by its suffix)."""
    path = Path(path).expanduser()
    doc = _parse(path)
    if not isinstance(doc, dict):
        raise BadConfig(f"--trtllm-options {path}: expected a mapping of LLM API options, got "
                        f"{type(doc).__name__}")
    spec = doc.get(SPEC_KEY)
    if not isinstance(spec, dict):
        raise BadConfig(f"--trtllm-options {path}: no {SPEC_KEY} mapping (expected {SPEC_KEY}: "
                        f"{{decoding_type: Eagle3, {IDS_KEY}: [...]}})")
    kind = spec.get("decoding_type")
    if kind not in DECODING_TYPES:
        raise BadConfig(f"--trtllm-options {path}: {SPEC_KEY}.decoding_type is {kind!r}; expected Eagle3 "
                        f"or Eagle")
    one = spec.get("eagle3_one_model", True)
    if not isinstance(one, bool):
        raise BadConfig(f"--trtllm-options {path}: {SPEC_KEY}.eagle3_one_model must be true or false, "
                        f"got {one!r}")
    draft_len = spec.get("max_draft_len")
    if draft_len is not None and (isinstance(draft_len, bool) or not isinstance(draft_len, int)
                                  or draft_len <= 0):
        raise BadConfig(f"--trtllm-options {path}: {SPEC_KEY}.max_draft_len must be a positive integer, "
                        f"got {draft_len!r}")
    model = spec.get("speculative_model", spec.get("speculative_model_dir"))
    return TrtllmOptions(str(path), kind, _ids(spec.get(IDS_KEY), path), one, draft_len,
                         None if model is None else str(model))


DEFAULT_DRAFT_LEN = 3


def draft_len_of(draft: str | Path) -> tuple[int, str]:
    """How many tokens the draft proposes per step, and where that was read: a speculators config's proposal
    method (``speculators_config.proposal_methods[].speculative_tokens``), else the steps it was trained to
    roll out (the training record's ``ttt_steps``), else ``DEFAULT_DRAFT_LEN``, said so."""
    cfg_path = Path(draft) / "config.json"
    cfg = read_json_file(cfg_path, "draft config") if cfg_path.is_file() else {}
    spec = cfg.get("speculators_config") if isinstance(cfg, dict) else None
    for method in (spec or {}).get("proposal_methods") or []:
        n = method.get("speculative_tokens") if isinstance(method, dict) else None
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n, "the draft's speculators_config (speculative_tokens)"
    record = read_record(draft)
    if record is not None and record.ttt_steps:
        return record.ttt_steps, "the steps it was trained to roll out (training.json ttt_steps)"
    return DEFAULT_DRAFT_LEN, f"{DEFAULT_DRAFT_LEN}: the draft names no depth; set it to what you serve"


def options_text(ids: list[int], draft: str | Path, *, one_model: bool = True) -> str:
    """The options YAML that makes TensorRT-LLM capture ``ids`` for ``draft``, its ``max_draft_len`` taken
    from the draft (``draft_len_of``)."""
    steps, where = draft_len_of(draft)
    doc = {SPEC_KEY: {"decoding_type": "Eagle3", "max_draft_len": steps,
                      "speculative_model": str(draft), "eagle3_one_model": one_model, IDS_KEY: list(ids)}}
    return ("# TensorRT-LLM launch options (trtllm-serve TARGET --extra_llm_api_options THIS_FILE);\n"
            "# written by `python -m helpers fixes deploy --engine trtllm`\n"
            f"# max_draft_len {steps}: {where}\n"
            + yaml.safe_dump(doc, sort_keys=False))
