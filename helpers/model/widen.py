"""A target at a real target's cost, with the same function: its feed-forward blocks zero-padded.

A decode step of a large target reads every weight it uses from memory, and a verify over k+1 tokens
reads them once for all k+1; a miniature that fits in a CPU's caches does neither, so a speed ratio
measured on it says nothing about a deployment. ``widen`` writes a copy of a Hugging Face target whose
feed-forward blocks (dense MLPs, routed and shared experts) have ``factor`` times the intermediate
width, the new rows of ``gate_proj`` / ``up_proj`` and the new columns of ``down_proj`` zero. Every new
unit computes ``silu(0) * 0 = 0`` and adds nothing, so the copy computes what the original does
(``Widened.check`` compares the two on real text), while an engine's kernels read and multiply
``factor`` times the feed-forward weights. Attention, norms, embeddings and the head are copied as they
are, so the hidden states a draft is fed are the original's.

For a mixture of experts this keeps the original's routing: a decode step reads the experts its one
token chose, a verify reads the union of what its k+1 tokens chose, which is why a verify of a large MoE
costs several decode steps (the original case's Kimi-K2.5: 384 experts, 8 per token). The draft is not
touched: it is as cheap beside the padded target as a real draft is beside a real one.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..errors import BadConfig

# config keys that set a feed-forward block's intermediate width, per family (the rest follow)
WIDTH_KEYS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size")
MLP_IN = ("gate_proj.weight", "up_proj.weight")          # [intermediate, hidden]: rows padded
MLP_OUT = ("down_proj.weight",)                          # [hidden, intermediate]: columns padded
# files a target folder carries beside its weights and config (tokenizer, generation settings)
KEEP = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
        "tokenizer.model", "vocab.json", "merges.txt", "training.json")


@dataclass(frozen=True)
class Widened:
    """A padded copy of a target: where it is, by how much, and what a token reads of it."""

    path: Path
    source: Path
    factor: int
    bytes_total: int           # every weight of the copy
    bytes_per_token: int       # what one decode token reads: dense weights, its experts, the head
    bytes_expert: int          # one routed expert of one layer (0 for a dense target)
    experts_per_token: int
    experts: int

    def sentence(self) -> str:
        """What the target is, in one sentence a reader can check against the files."""
        mb = lambda b: f"{b / 2**20:,.0f} MiB"   # noqa: E731
        moe = (f", {self.experts_per_token} of {self.experts} routed experts per token, so a verify of k+1 "
               f"tokens reads the union of theirs" if self.experts else "")
        src = self.source
        name = f"{src.parent.name}/{src.name}" if src.name == "target" else src.name
        return (f"the target is {name} with its feed-forward blocks zero-padded to "
                f"{self.factor}x their width (the same function, checked on real text): "
                f"{mb(self.bytes_total)} of weights, "
                f"{mb(self.bytes_per_token)} read per decode token{moe}")

    def to_dict(self) -> dict:
        return {"path": str(self.path), "source": str(self.source), "factor": self.factor,
                "bytes_total": self.bytes_total, "bytes_per_token": self.bytes_per_token,
                "bytes_expert": self.bytes_expert, "experts_per_token": self.experts_per_token,
                "experts": self.experts, "sentence": self.sentence()}


def _weight_files(src: Path) -> list[Path]:
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise BadConfig(f"{src}: expected the target's weights as *.safetensors, found none")
    return files


def _pad(name: str, t: torch.Tensor, factor: int) -> torch.Tensor:
    if name.endswith(MLP_IN):
        out = t.new_zeros((t.shape[0] * factor, *t.shape[1:]))
        out[: t.shape[0]] = t
        return out
    if name.endswith(MLP_OUT):
        out = t.new_zeros((t.shape[0], t.shape[1] * factor))
        out[:, : t.shape[1]] = t
        return out
    return t


def _stamp(src: Path, factor: int) -> str:
    """What the copy depends on: the source's config and weight files (size and mtime), the factor."""
    parts = [f"factor={factor}", (src / "config.json").read_text(encoding="utf-8")]
    for f in _weight_files(src):
        st = f.stat()
        parts.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
    return "\n".join(parts)


def widen(src: str | Path, out: str | Path, factor: int) -> Widened:
    """Write ``src`` with its feed-forward blocks ``factor`` times as wide into ``out`` (reused when it was
    written from the same files with the same factor) and say what a decode token reads of it."""
    src, out = Path(src).resolve(), Path(out).resolve()
    if factor < 1:
        raise BadConfig(f"widen: expected a factor of 1 or more, got {factor}")
    cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    if not any(k in cfg for k in WIDTH_KEYS):
        raise BadConfig(f"{src}/config.json: expected one of {', '.join(WIDTH_KEYS)} (a feed-forward width "
                        f"to pad), found none")
    stamp = _stamp(src, factor)
    if (out / "widened.stamp").is_file() and (out / "widened.stamp").read_text(encoding="utf-8") == stamp:
        return _measure(out, src, factor)
    if out.exists():
        shutil.rmtree(out)
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for f in _weight_files(src):
        state = {}
        with safe_open(f, "pt") as s:
            for name in s.keys():
                state[name] = _pad(name, s.get_tensor(name), factor).contiguous()
        save_file(state, tmp / f.name, metadata={"format": "pt"})
    index = src / "model.safetensors.index.json"
    if index.is_file():
        shutil.copy2(index, tmp / index.name)
    wide = dict(cfg)
    for k in WIDTH_KEYS:
        if isinstance(cfg.get(k), int):
            wide[k] = cfg[k] * factor
    wide["widened_from"] = {"source": src.name, "factor": factor,
                            "note": "feed-forward blocks zero-padded: the same function, more weights"}
    (tmp / "config.json").write_text(json.dumps(wide, indent=2) + "\n", encoding="utf-8")
    for name in KEEP:
        if (src / name).is_file():
            shutil.copy2(src / name, tmp / name)
    (tmp / "widened.stamp").write_text(stamp, encoding="utf-8")
    tmp.rename(out)
    return _measure(out, src, factor)


def _measure(path: Path, src: Path, factor: int) -> Widened:
    """The copy's bytes, in total and per decode token, from its safetensors headers."""
    cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    experts = int(cfg.get("n_routed_experts") or cfg.get("num_experts") or 0)
    per_tok = int(cfg.get("num_experts_per_tok") or 0) if experts else 0
    total = routed = 0          # routed: bytes a decode token does not read (other experts, embedding rows)
    one_expert: dict[str, int] = {}
    for f in _weight_files(path):
        with safe_open(f, "pt") as s:
            for name in s.keys():
                sl = s.get_slice(name)
                n = 1
                for d in sl.get_shape():
                    n *= d
                b = n * torch.finfo(getattr(torch, {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
                                            .get(sl.get_dtype(), "float32"))).bits // 8
                total += b
                if name.endswith("embed_tokens.weight"):     # a token reads its own row
                    routed += b - b // max(sl.get_shape()[0], 1)
                if ".mlp.experts." in name:
                    routed += b
                    layer = name.split(".mlp.experts.")[0]
                    if name.split(".mlp.experts.")[1].startswith("0."):
                        one_expert[layer] = one_expert.get(layer, 0) + b
    moe_layers = len(one_expert)
    bytes_expert = max(one_expert.values()) if one_expert else 0
    per_token = total - routed + sum(one_expert.values()) * per_tok
    return Widened(path=path, source=src, factor=factor, bytes_total=total, bytes_per_token=per_token,
                   bytes_expert=bytes_expert, experts_per_token=per_tok if moe_layers else 0,
                   experts=experts if moe_layers else 0)


@dataclass(frozen=True)
class SameFunction:
    """The padded copy against its source on real text: how many next-token choices agree, and the
    largest logit difference relative to the largest logit."""

    text: str
    positions: int
    argmax_equal: int
    max_relative_diff: float

    def to_dict(self) -> dict:
        return {"text": self.text, "positions": self.positions, "argmax_equal": self.argmax_equal,
                "max_relative_diff": self.max_relative_diff}


TOLERANCE = 1e-4        # float32 sums in another order differ by ~1e-7 of the logits; a wrong pad by ~1


def same_function(wide: Widened, tokens: int = 256) -> SameFunction:
    """Run the source and the copy on the source pair's held-out text (``heldout.txt`` beside it, else its
    prompts) and raise ``BadConfig`` unless their logits agree to ``TOLERANCE``. Checked once per copy: the
    result is kept beside it (``same_function.json``)."""
    kept = wide.path / "same_function.json"
    if kept.is_file():
        return SameFunction(**json.loads(kept.read_text(encoding="utf-8")))
    from .target import load_target

    text_file = next((f for f in (wide.source.parent / "heldout.txt", wide.source.parent / "prompts.jsonl")
                      if f.is_file()), None)
    if text_file is None:
        raise BadConfig(f"widen: no heldout.txt or prompts.jsonl beside {wide.source} to check the copy on")
    src_model, tok = load_target(wide.source)
    ids = tok(text_file.read_text(encoding="utf-8")[:4000], return_tensors="pt").input_ids[:, :tokens]
    with torch.no_grad():
        ref = src_model(ids).logits.float()
        del src_model
        wide_model, _ = load_target(wide.path)
        got = wide_model(ids).logits.float()
    rel = float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-9))
    out = SameFunction(text=text_file.name, positions=int(ids.shape[1]),
                       argmax_equal=int((got.argmax(-1) == ref.argmax(-1)).sum()), max_relative_diff=rel)
    if rel > TOLERANCE:
        raise BadConfig(f"widen: {wide.path} does not compute what {wide.source} does (logits differ by "
                        f"{rel:.2e} of the largest on {text_file.name}); expected a zero-padded copy")
    kept.write_text(json.dumps(out.to_dict()) + "\n", encoding="utf-8")
    return out
