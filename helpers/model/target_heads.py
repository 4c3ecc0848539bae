"""The three tensors of a target a dump diagnosis needs, read without loading the model.

A 1T-parameter target cannot be loaded in transformers on one device, and it does not have to
be: naming a dump's slots and scoring a draft against the target's own distribution need only
``embed_tokens`` (boundary 0 is exactly the embedding lookup), the final norm and ``lm_head``
(the final boundary's logits). Those are found through the safetensors index and read tensor by
tensor; nothing else of the checkpoint is touched.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from ..errors import BadCheckpoint, read_json_file
from ..rules.conventions import TEXT_KEYS, TargetSpec, read_target

HEAD_KEYS = ("num_hidden_layers", "hidden_size", "vocab_size")


def _weight_map(path: Path) -> dict[str, Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            wm = read_json_file(index, "shard index")["weight_map"]
        except (KeyError, TypeError) as exc:
            raise BadCheckpoint(f"{index} is not a shard index with a weight_map: {exc}") from None
        if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
            raise BadCheckpoint(f"{index}: weight_map is a JSON {type(wm).__name__}; expected an object "
                                f"{{tensor name: shard file}}")
        return {k: path / v for k, v in wm.items()}
    single = path / "model.safetensors"
    if single.is_file():
        try:
            with safe_open(str(single), framework="pt") as st:
                return {k: single for k in st.keys()}
        except SafetensorError as exc:
            raise BadCheckpoint(f"{single}: not a readable safetensors file: {exc}") from None
    raise FileNotFoundError(f"no safetensors weights at {path} (model.safetensors or "
                            f"model.safetensors.index.json); the target's embed_tokens, final norm and "
                            f"lm_head are read from them")


def _pick(keys, suffix: str, exclude=(".layers.", "mtp", "vision", "visual", "audio")) -> str | None:
    """The shortest key ending in ``suffix`` outside the decoder layers and non-text towers."""
    cands = [k for k in keys if k.endswith(suffix) and not any(x in k for x in exclude)]
    return min(cands, key=len) if cands else None


def _read(wm: dict[str, Path], key: str) -> torch.Tensor:
    f = wm[key]
    if not f.is_file():
        raise FileNotFoundError(f"the shard index names {f.name} for {key}, which is not in {f.parent}")
    try:
        with safe_open(str(f), framework="pt") as st:
            t = st.get_tensor(key)
    except SafetensorError as exc:
        raise BadCheckpoint(f"{f}: cannot read {key}: {exc}") from None
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        raise BadCheckpoint(f"{f}: {key} holds {int((~torch.isfinite(t)).sum())} non-finite values")
    return t


@dataclass
class TargetHeads:
    """Embedding, final norm and head of a target, plus its config; quacks enough like a
    transformers model (``config``, ``get_input_embeddings``) for a draft to borrow the embedding."""

    path: Path
    config: SimpleNamespace
    embed: nn.Embedding
    norm_weight: torch.Tensor
    lm_head: torch.Tensor               # [V, H], kept in its stored dtype; used in row chunks
    eps: float
    gemma_style: bool = False           # (1 + w) norm and sqrt(H)-scaled embedding
    notes: list[str] = field(default_factory=list)

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def arch(self) -> str:
        return (self.config.architectures or [self.config.model_type or "unknown"])[0]

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed

    def boundary0(self, token_ids: torch.Tensor) -> torch.Tensor:
        """What the residual stream holds entering layer 0 (Gemma scales the lookup by sqrt(H))."""
        x = self.embed(token_ids)
        return x * (self.config.hidden_size ** 0.5) if self.gemma_style else x

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        w = self.norm_weight.float()
        return x * (1.0 + w) if self.gemma_style else x * w

    @torch.no_grad()
    def logits(self, normed: torch.Tensor, rows: torch.Tensor | None = None,
               chunk: int = 16384) -> torch.Tensor:
        """``lm_head`` on already-normed states, in fp32, over all rows or only ``rows`` (a draft
        vocabulary); the head is converted a chunk at a time so a large vocabulary never doubles."""
        head = self.lm_head if rows is None else self.lm_head[rows]
        x = normed.float()
        return torch.cat([x @ head[i:i + chunk].float().T for i in range(0, head.shape[0], chunk)], -1)


def load_target_heads(path, spec: TargetSpec | None = None) -> TargetHeads:
    """The embedding, final norm and head of a target, and nothing else. ``spec``: its config already read
    (with ``HEAD_KEYS``), so a caller that read it once does not read it again."""
    path = Path(path)
    cfg = (spec if spec is not None else read_target(path, HEAD_KEYS)).config
    wm = _weight_map(path)
    keys = list(wm)
    emb_key = _pick(keys, "embed_tokens.weight") or _pick(keys, "wte.weight")
    norm_key = _pick(keys, "norm.weight", exclude=(".layers.", "mtp", "vision", "visual", "audio",
                                                   "layernorm", "q_norm", "k_norm", "kv_a", "q_a"))
    head_key = _pick(keys, "lm_head.weight")
    if emb_key is None or norm_key is None:
        raise BadCheckpoint(f"{path}: cannot find the embedding and final norm among {len(keys)} tensors "
                            f"(looked for *embed_tokens.weight and *norm.weight outside the layers)")
    emb = _read(wm, emb_key)
    head = _read(wm, head_key) if head_key else emb
    notes = [f"read {emb_key}, {norm_key}, {head_key or emb_key + ' (tied head)'} from {path}; nothing else "
             f"loaded"]
    if tuple(emb.shape) != (cfg["vocab_size"], cfg["hidden_size"]):
        raise BadCheckpoint(f"{path}: {emb_key} is {tuple(emb.shape)}; config.json says vocab_size "
                            f"{cfg['vocab_size']} x hidden_size {cfg['hidden_size']}")
    ns = SimpleNamespace(**{k: cfg.get(k) for k in TEXT_KEYS})
    embed = nn.Embedding(emb.shape[0], emb.shape[1])
    embed.weight = nn.Parameter(emb.float(), requires_grad=False)
    gemma = str(cfg.get("model_type", "")).startswith("gemma")
    if gemma:
        notes.append("Gemma family: boundary 0 is the embedding scaled by sqrt(hidden_size), the norm is "
                     "(1 + w)")
    return TargetHeads(path, ns, embed, _read(wm, norm_key), head, float(cfg.get("rms_norm_eps") or 1e-6),
                       gemma, notes)
