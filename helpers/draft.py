"""The EAGLE-3 draft: module, KV cache, and both checkpoint formats real drafts ship in.

Shape of the model (as SGLang's ``LlamaForCausalLMEagle3`` runs it): ``fc`` folds the
target's fused feature (width n*H_target) to H; one decoder layer attends over
``cat(input_layernorm(embed), hidden_norm(h))`` (width 2H); the pre-norm output is both
what the next draft step is fed and, after ``norm`` and ``lm_head``, a distribution over a
reduced *draft vocabulary* mapped back with ``d2t`` (``target_id = draft_id + d2t[id]``).

Formats read and written:
- SGLang / SpecForge / EAGLE reference: ``architectures: ["LlamaForCausalLMEagle3"]``, ids under
  ``eagle_config.eagle_aux_hidden_state_layer_ids``, weights ``midlayer.*``.
- speculators: ``architectures: ["Eagle3Speculator"]``, ``transformer_layer_config``,
  top-level ``eagle_aux_hidden_state_layer_ids``, weights ``layers.0.*``.

Weights are read from ``model.safetensors``, a sharded ``model.safetensors.index.json``, or
``pytorch_model.bin`` (the EAGLE reference code and some SpecForge runs write only that), under
either layer prefix, since tools mix them. Real drafts differ in ways that change the forward
without changing any tensor shape (``norm_before_residual``, a missing or partial vocabulary
map), so those are read and checked here rather than left to defaults that would run silently.
"""
from __future__ import annotations

import json
import math
import pickle
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from .conventions import (
    NORM_BEFORE_RESIDUAL_ON_SGLANG,
    SGLANG_DRAFT_ARCH,
    SPECULATORS_ARCH,
    IdsAt,
    honours_norm_before_residual,
    ids_in_config,
    read_draft_config,
)
from .errors import BadCheckpoint, BadConfig, check_finite_weights, read_json_file

SGLANG_ARCH = SGLANG_DRAFT_ARCH


class DraftFormatError(BadCheckpoint):
    """A draft checkpoint that does not fit the target or is not an EAGLE-3 draft."""


class ServingMismatchWarning(UserWarning):
    """The draft loads and runs here, but an engine would run it with a different forward."""


# speculators config flags that change the forward and that this draft does not implement:
# loading them as if unset would evaluate a model the checkpoint is not.
UNSUPPORTED_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")

@contextmanager
def run_as(draft, engine: str):
    """Run ``draft`` the way ``engine`` runs it, for the duration of the block.

    Emulating a deployment means emulating the engine's forward too, not only its wiring:
    SGLang's llama_eagle3 has no norm_before_residual, so a draft trained with it is served
    without it; vLLM honours it. Yields notes saying what was switched, for the reports.
    """
    saved = draft.cfg.norm_before_residual
    notes = []
    if saved and not honours_norm_before_residual(engine):
        draft.cfg.norm_before_residual = False
        notes.append(f"run as {engine} runs it: norm_before_residual ignored (the draft was trained with it)")
    try:
        yield notes
    finally:
        draft.cfg.norm_before_residual = saved


@dataclass
class DraftConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int                 # the target's vocabulary
    draft_vocab_size: int
    target_hidden_size: int
    num_aux: int = 3                # slots in the fused feature
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    eagle_ids: list[int] | None = None      # as the config file holds them
    ids_location: str = IdsAt.EAGLE_CONFIG   # where the file held them (conventions.IdsAt)
    format: str = "sglang"
    norm_before_residual: bool = False       # residual of the hidden input taken after hidden_norm

    @property
    def fc_in(self) -> int:
        return self.num_aux * self.target_hidden_size


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32,
                                        device=positions.device) / head_dim))
    ang = positions.float()[..., None] * inv
    emb = torch.cat([ang, ang], -1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    # x: [B, heads, T, D]; cos/sin: [B, T, D]
    cos, sin = cos[:, None], sin[:, None]
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


class DraftKVCache:
    """Keys/values of the draft's one layer, cropped back after each speculation round.

    Entries come from two sources: columns fed the target's features (kept), and the
    draft's own chain steps (discarded by ``crop`` once the target has verified them).
    """

    def __init__(self, cfg: DraftConfig, batch: int = 1, max_len: int = 2048, device="cpu",
                 dtype=torch.float32):
        shape = (batch, cfg.num_key_value_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0

    def append(self, k, v):
        n = k.shape[2]
        if self.length + n > self.k.shape[2]:
            raise RuntimeError(f"draft KV cache full ({self.k.shape[2]} entries)")
        self.k[:, :, self.length:self.length + n] = k
        self.v[:, :, self.length:self.length + n] = v
        self.length += n
        return self.k[:, :, :self.length], self.v[:, :, :self.length]

    def crop(self, length: int):
        self.length = min(self.length, length)


class DraftAttention(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.cfg = cfg
        h2 = 2 * cfg.hidden_size
        self.q_proj = nn.Linear(h2, cfg.num_attention_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(h2, cfg.num_key_value_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(h2, cfg.num_key_value_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def qkv(self, x, positions):
        b, t, _ = x.shape
        c = self.cfg
        q = self.q_proj(x).view(b, t, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        cos, sin = rope_tables(positions, c.head_dim, c.rope_theta)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _expand(self, kv):
        rep = self.cfg.num_attention_heads // self.cfg.num_key_value_heads
        return kv.repeat_interleave(rep, dim=1) if rep > 1 else kv

    def forward_cached(self, x, positions, cache: DraftKVCache):
        """Decode/extend: new queries attend to every cached entry and causally to each other."""
        q, k, v = self.qkv(x, positions)
        past = cache.length
        keys, vals = cache.append(k, v)
        t = x.shape[1]
        mask = torch.ones(t, past + t, dtype=torch.bool, device=x.device).tril(diagonal=past)
        out = F.scaled_dot_product_attention(q, self._expand(keys), self._expand(vals), attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(x.shape[0], t, -1))

    def forward_ttt(self, x, positions, past_kv: list[tuple[torch.Tensor, torch.Tensor]]):
        """Training-time test: column t of step j sees step-0 keys 0..t and its own column
        at steps 1..j -- exactly what a chain step sees at inference after ``crop``."""
        q, k, v = self.qkv(x, positions)
        past_kv.append((k, v))
        if len(past_kv) == 1:  # step 0 is plain causal attention: let SDPA do it
            out = F.scaled_dot_product_attention(q, self._expand(k), self._expand(v), is_causal=True)
            return self.o_proj(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))
        k0, v0 = self._expand(past_kv[0][0]), self._expand(past_kv[0][1])
        scale = 1.0 / math.sqrt(self.cfg.head_dim)
        t = x.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        s0 = (q @ k0.transpose(-1, -2)) * scale
        s0 = s0.masked_fill(~causal, float("-inf"))
        diag = [(q * self._expand(kj)).sum(-1, keepdim=True) * scale for kj, _ in past_kv[1:]]
        scores = torch.cat([s0] + diag, -1).softmax(-1)
        out = scores[..., :t] @ v0
        for j, (_, vj) in enumerate(past_kv[1:]):
            out = out + scores[..., t + j:t + j + 1] * self._expand(vj)
        return self.o_proj(out.transpose(1, 2).reshape(x.shape[0], t, -1))


class DraftMLP(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.cfg = cfg      # shared with the draft: flipping norm_before_residual there takes effect here
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DraftMLP(cfg)

    def forward(self, embeds, hidden, attend):
        """``norm_before_residual`` (speculators, vLLM) adds the attention output to the
        *normed* hidden input instead of the raw one; SGLang and the EAGLE reference always
        use the raw one. Same weights, different function: it must follow the checkpoint."""
        normed = self.hidden_norm(hidden)
        residual = normed if self.cfg.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed], -1)
        residual = attend(x) + residual
        return self.mlp(self.post_attention_layernorm(residual)) + residual


class Eagle3Draft(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(cfg.fc_in, cfg.hidden_size, bias=False)
        self.midlayer = DraftLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))

    # -- the two ways in ---------------------------------------------------------------

    def project(self, hidden):
        """The fused target feature goes through ``fc``; the draft's own state does not."""
        if hidden.shape[-1] == self.cfg.hidden_size and self.cfg.fc_in != self.cfg.hidden_size:
            return hidden
        if hidden.shape[-1] != self.cfg.fc_in:
            raise DraftFormatError(
                f"draft fed a feature of width {hidden.shape[-1]}; its fc expects {self.cfg.fc_in} "
                f"({self.cfg.num_aux} x {self.cfg.target_hidden_size}) or its own width "
                f"{self.cfg.hidden_size}")
        return self.fc(hidden)

    def step(self, input_ids, hidden, positions, cache: DraftKVCache):
        """Cached forward of new columns -> (draft-vocab logits, pre-norm state to feed back)."""
        h = self.project(hidden)
        embeds = self.embed_tokens(input_ids).to(h.dtype)
        out = self.midlayer(embeds, h, lambda x: self.midlayer.self_attn.forward_cached(x, positions, cache))
        return self.lm_head(self.norm(out)), out

    def ttt_forward(self, input_ids, fused, steps: int, projected: bool = False):
        """Teacher-forced unroll over ``steps`` draft steps; returns logits per step.

        Step j at column t is fed token ``input_ids[t + 1 + j]`` and, for j > 0, the state
        step j-1 produced at column t. Logits of step j predict the target's next token at
        position ``t + 1 + j``; columns past the end are padded and must be masked by the caller.
        ``projected`` says ``fused`` already went through ``fc`` (the layout search sums
        per-slot projections instead of re-running ``fc`` for every layout).
        """
        b, t = input_ids.shape
        h = fused if projected else self.project(fused)
        past_kv: list = []
        base = torch.arange(t, device=input_ids.device).expand(b, t)
        pad = torch.zeros(b, steps + 1, dtype=input_ids.dtype, device=input_ids.device)
        ids = torch.cat([input_ids, pad], 1)
        all_logits = []
        for j in range(steps):
            embeds = self.embed_tokens(ids[:, 1 + j:1 + j + t]).to(h.dtype)
            pos = base + j
            h = self.midlayer(embeds, h, lambda x: self.midlayer.self_attn.forward_ttt(x, pos, past_kv))
            all_logits.append(self.lm_head(self.norm(h)))
        return all_logits

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    @property
    def draft_token_ids(self) -> torch.Tensor:
        """Target ids of the draft vocabulary, in draft-id order."""
        return self.to_target_ids(torch.arange(self.cfg.draft_vocab_size, device=self.d2t.device))


# --------------------------------------------------------------------------------------
# Vocabulary map


def vocab_maps(draft_target_ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted target ids of the draft vocabulary -> (d2t offsets, t2d mask)."""
    ids = torch.sort(draft_target_ids.long()).values
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.numel():
        raise DraftFormatError(f"draft vocabulary holds target id {int(bad[0])}; target ids run "
                               f"0..{vocab_size - 1}")
    d2t = ids - torch.arange(ids.numel())
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return d2t, t2d


# --------------------------------------------------------------------------------------
# Checkpoint formats


def _layer_cfg_from(cfg_json: dict) -> dict:
    return cfg_json.get("transformer_layer_config") or cfg_json


def _need(d: dict, key: str, where: str = "config"):
    """A field the forward cannot be built without: a BadConfig naming it, not a bare KeyError."""
    if key not in d or d[key] is None:
        raise BadConfig(f"{where} lacks {key!r}; an EAGLE-3 draft config must state hidden_size, "
                        f"intermediate_size, num_attention_heads and vocab_size")
    return d[key]


def draft_format(cfg_json: dict) -> str:
    arch = (cfg_json.get("architectures") or [""])[0]
    if arch == SPECULATORS_ARCH or cfg_json.get("speculators_model_type") == "eagle3":
        return "speculators"
    if "eagle3" in arch.lower() or "eagle_config" in cfg_json:
        return "sglang"
    raise DraftFormatError(f"config architectures {cfg_json.get('architectures')} is not an EAGLE-3 draft "
                           f"(expected {SGLANG_ARCH} or {SPECULATORS_ARCH})")


def _flag(cfg_json: dict, layer: dict, name: str) -> bool:
    """A boolean the tools write top-level (speculators, SGLang-style configs) or, rarely, in the
    layer config. A string such as "true" is refused: it would read as set whatever it says."""
    value = cfg_json.get(name, layer.get(name, False))
    if value is None:
        return False
    if not isinstance(value, bool):
        raise DraftFormatError(f"config {name} is {value!r}; expected true or false")
    return value


def config_from_json(cfg_json: dict) -> DraftConfig:
    fmt = draft_format(cfg_json)
    layer = _layer_cfg_from(cfg_json)
    for name in UNSUPPORTED_FLAGS:
        if _flag(cfg_json, layer, name):
            raise DraftFormatError(f"config sets {name}=true; this draft implements only {name}=false, so it "
                                   f"would run a different forward from the checkpoint's (SGLang's "
                                   f"llama_eagle3.py has no {name} either)")
    h = _need(layer, "hidden_size")
    heads = _need(layer, "num_attention_heads")
    ids, where = ids_in_config(cfg_json)
    rope = layer.get("rope_parameters") or layer.get("rope_scaling") or {}
    theta = layer.get("rope_theta") or rope.get("rope_theta") or 10000.0
    return DraftConfig(
        hidden_size=h, intermediate_size=_need(layer, "intermediate_size"), num_attention_heads=heads,
        num_key_value_heads=layer.get("num_key_value_heads") or heads,
        head_dim=layer.get("head_dim") or h // heads,
        vocab_size=cfg_json.get("vocab_size") or _need(layer, "vocab_size"),
        draft_vocab_size=(cfg_json.get("draft_vocab_size") or layer.get("draft_vocab_size")
                          or _need(layer, "vocab_size")),
        target_hidden_size=cfg_json.get("target_hidden_size") or layer.get("target_hidden_size") or h,
        num_aux=int(cfg_json.get("num_aux_hidden_states", 3)),
        rms_norm_eps=layer.get("rms_norm_eps", 1e-6), rope_theta=float(theta),
        max_position_embeddings=layer.get("max_position_embeddings", 2048),
        eagle_ids=ids, ids_location=where, format=fmt,
        norm_before_residual=_flag(cfg_json, layer, "norm_before_residual"),
    )


def _llama_layer_json(cfg: DraftConfig) -> dict:
    return {
        "model_type": "llama", "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim, "num_hidden_layers": 1, "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings, "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }


def config_to_json(cfg: DraftConfig, fmt: str, extra: dict | None = None) -> dict:
    if fmt == "sglang":
        out = {"architectures": [SGLANG_ARCH], **_llama_layer_json(cfg),
               "draft_vocab_size": cfg.draft_vocab_size, "target_hidden_size": cfg.target_hidden_size}
        if cfg.eagle_ids is not None:
            out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(cfg.eagle_ids),
                                   "use_aux_hidden_state": True}
        if cfg.norm_before_residual:      # vLLM reads it top-level; SGLang ignores it (see load_draft)
            out["norm_before_residual"] = True
    elif fmt == "speculators":
        out = {"architectures": [SPECULATORS_ARCH], "speculators_model_type": "eagle3",
               "transformer_layer_config": _llama_layer_json(cfg), "draft_vocab_size": cfg.draft_vocab_size,
               "target_hidden_size": cfg.target_hidden_size, "norm_before_residual": cfg.norm_before_residual,
               "speculators_version": "0.5.0"}
        if cfg.eagle_ids is not None:
            out["eagle_aux_hidden_state_layer_ids"] = list(cfg.eagle_ids)
    else:
        raise ValueError(f"unknown draft format {fmt!r}; expected 'sglang' or 'speculators'")
    out.update(extra or {})
    return out


def _layer_prefix(fmt: str) -> str:
    return "midlayer." if fmt == "sglang" else "layers.0."


def save_draft(draft: Eagle3Draft, out_dir: str | Path, fmt: str = "sglang", extra_config: dict | None = None,
               dtype: torch.dtype = torch.bfloat16, with_embedding: bool | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors``.

    The embedding normally stays with the target (engines borrow it); a draft whose width
    differs from the target's cannot borrow it, so by default its own is written, or the
    checkpoint could not be loaded again. ``with_embedding`` overrides that choice.
    """
    out = Path(out_dir)
    if with_embedding is None:
        with_embedding = draft.cfg.hidden_size != draft.cfg.target_hidden_size
    cfg_json = config_to_json(draft.cfg, fmt, extra_config)     # rejects an unknown format before any write
    out.mkdir(parents=True, exist_ok=True)
    prefix = _layer_prefix(fmt)
    tensors = {}
    for name, t in draft.state_dict().items():
        if name.startswith("embed_tokens.") and not with_embedding:
            continue
        key = prefix + name[len("midlayer."):] if name.startswith("midlayer.") else name
        tensors[key] = t.detach().to(dtype).contiguous() if t.is_floating_point() else t.contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg_json, indent=2) + "\n")
    return out


# Looked for in this order (the order transformers prefers); the first present is read.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
_LAYER_PREFIXES = ("midlayer.", "layers.0.")
# Some speculators versions keep the verifier's frozen head beside the draft; it is the
# target's, not part of the draft's forward.
_VERIFIER_PREFIXES = ("verifier_lm_head.", "verifier_norm.")


def _read_weight_file(f: Path, as_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """``as_dtype``: floating tensors converted as each is read, so a large draft never holds its
    stored (bf16) copy and its compute (fp32) copy whole at the same time."""
    if f.name.endswith(".safetensors"):
        try:
            if as_dtype is None:
                return load_file(str(f))
            out = {}
            with safe_open(str(f), framework="pt") as st:
                for k in st.keys():
                    t = st.get_tensor(k)
                    out[k] = t.to(as_dtype) if t.is_floating_point() else t
            return out
        except Exception as e:  # SafetensorError (truncated, bad header) has no importable base class
            raise DraftFormatError(f"{f} is not a readable safetensors file ({type(e).__name__}: "
                                   f"{str(e).splitlines()[0] if str(e) else 'no detail'}); truncated or "
                                   f"overwritten? expected a complete model.safetensors") from None
    try:
        obj = torch.load(f, weights_only=True, map_location="cpu")
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as e:
        raise DraftFormatError(f"{f} is not a weights-only PyTorch state dict: {e}") from e
    if not isinstance(obj, dict):
        raise DraftFormatError(f"{f} holds a {type(obj).__name__}; expected a dict of tensor name -> tensor")
    bad = [f"{k!r} ({type(v).__name__})" for k, v in obj.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise DraftFormatError(f"{f} holds non-tensor entries {bad[:5]}; expected a dict of tensor name -> "
                               f"tensor")
    return obj


def _read_sharded(index: Path, as_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Shards named by ``weight_map``; every mapped key must be found in its shard, or the
    checkpoint is incomplete (a shard overwritten or from another run)."""
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
    except (json.JSONDecodeError, AttributeError) as e:
        raise DraftFormatError(f"{index} is not a shard index: expected JSON with a weight_map") from e
    if not isinstance(weight_map, dict) or not weight_map:
        raise DraftFormatError(f"{index} has no weight_map {{tensor name: shard file}}; got {weight_map!r}")
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        f = index.parent / shard
        if not f.is_file():
            raise FileNotFoundError(f"{index} names shard {shard}, which is not in {index.parent}")
        out.update(_read_weight_file(f, as_dtype))
    lost = [f"{k} (in {v})" for k, v in weight_map.items() if k not in out]
    if lost:
        raise DraftFormatError(f"{index} maps tensors its shards do not hold: {lost[:5]}")
    return out


def read_draft_weights(path: str | Path,
                       as_dtype: torch.dtype | None = None) -> tuple[dict[str, torch.Tensor], Path]:
    """The raw tensors of a draft directory (floating ones in ``as_dtype`` when given), and the
    file they came from (for error messages)."""
    path = Path(path)
    for name in WEIGHT_FILES:
        f = path / name
        if f.is_file():
            return (_read_sharded(f, as_dtype) if name.endswith(".index.json")
                    else _read_weight_file(f, as_dtype)), f
    raise FileNotFoundError(f"no weights at {path / WEIGHT_FILES[0]}: expected one of "
                            f"{', '.join(WEIGHT_FILES)} in {path}")


def canonical_state(raw: dict[str, torch.Tensor],
                    source: str | Path = "checkpoint") -> dict[str, torch.Tensor]:
    """Map the names real drafts use onto this module's: the layer as ``midlayer.*`` whether
    the file says ``midlayer.*`` (SGLang, SpecForge, EAGLE reference) or ``layers.0.*``
    (speculators), with an HF-style ``model.`` wrapper dropped. A second decoder layer is
    refused rather than dropped: the draft would run without it."""
    state: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    deeper: set[str] = set()
    for key, v in raw.items():
        k = key[len("model."):] if key.startswith("model.") else key
        if k.startswith(_VERIFIER_PREFIXES):
            continue
        if k.startswith("layers.0."):
            k = "midlayer." + k[len("layers.0."):]
        elif k.startswith("layers.") and k.split(".")[1].isdigit():
            deeper.add(f"layers.{k.split('.')[1]}.*")
            continue
        if k in state:
            raise DraftFormatError(f"{source} holds both {origin[k]!r} and {key!r}, two names for the "
                                   f"draft's {k}")
        state[k] = v
        origin[k] = key
    if deeper:
        raise DraftFormatError(f"{source} has weights for more decoder layers ({', '.join(sorted(deeper))}); "
                               f"this draft, like SGLang's LlamaForCausalLMEagle3, runs exactly one "
                               f"(midlayer.* or layers.0.*)")
    return state


def _vocab_buffers(state: dict, cfg: DraftConfig, source) -> tuple[torch.Tensor, torch.Tensor]:
    """``d2t`` is what engines use (vLLM and SGLang drop ``t2d``), so it is required whenever
    the draft vocabulary is a subset; ``t2d`` follows from it and, when shipped, must agree."""
    d2t, t2d = state.get("d2t"), state.get("t2d")
    if d2t is None:
        if cfg.draft_vocab_size != cfg.vocab_size:
            has = "t2d but no d2t" if t2d is not None else "no d2t"
            raise DraftFormatError(
                f"{source} has {has}, but draft_vocab_size {cfg.draft_vocab_size} differs from the target "
                f"vocab_size {cfg.vocab_size}: an identity map (draft id i = target id i) is only right when "
                f"they are equal, and engines read only d2t")
        d2t = torch.zeros(cfg.draft_vocab_size, dtype=torch.long)
    if d2t.is_floating_point() or d2t.dtype == torch.bool or d2t.dim() != 1:
        raise DraftFormatError(f"d2t is {d2t.dtype} of shape {tuple(d2t.shape)}; expected int64 offsets of "
                               f"shape ({cfg.draft_vocab_size},)")
    d2t = d2t.long()
    check_vocab_map(d2t, cfg)
    derived = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    derived[torch.arange(d2t.numel()) + d2t] = True
    if t2d is None:
        return d2t, derived
    if tuple(t2d.shape) != (cfg.vocab_size,):
        raise DraftFormatError(f"t2d has shape {tuple(t2d.shape)}; expected ({cfg.vocab_size},), one flag "
                               f"per target id")
    t2d = t2d.bool()
    if not torch.equal(t2d, derived):
        i = int((t2d != derived).nonzero()[0])
        raise DraftFormatError(
            f"t2d and d2t disagree: t2d marks {int(t2d.sum())} target ids, d2t maps to {int(derived.sum())}; "
            f"first difference at target id {i} (t2d says {bool(t2d[i])}, d2t says {bool(derived[i])})")
    return d2t, t2d


def load_draft(path: str | Path, target=None, device="cpu", dtype=torch.float32) -> Eagle3Draft:
    """Read any of the formats above.

    ``target`` supplies the embedding when the checkpoint has none (and is checked for fit);
    a checkpoint's own ``embed_tokens`` wins, as it does in SGLang and vLLM. Warns with
    :class:`ServingMismatchWarning` where SGLang would run the draft differently.
    """
    path = Path(path)
    cfg_json = read_draft_config(path)
    try:
        cfg = config_from_json(cfg_json)
    except (BadConfig, DraftFormatError) as exc:
        raise type(exc)(f"{path / 'config.json'}: {exc}") from None
    raw, source = read_draft_weights(path, as_dtype=dtype)
    state = canonical_state(raw, source)
    if "fc.weight" not in state:
        raise DraftFormatError(f"{source} has no fc.weight; keys start {sorted(raw)[:5]}")
    check_finite_weights(state.items(), f"draft {source}")
    if state["fc.weight"].dim() != 2 or state["fc.weight"].shape[0] != cfg.hidden_size:
        raise DraftFormatError(f"{path / 'config.json'} says hidden_size {cfg.hidden_size}, but {source} "
                               f"holds fc.weight {tuple(state['fc.weight'].shape)} "
                               f"({state['fc.weight'].shape[0]} wide): the config does not describe these "
                               f"weights")
    fc_in = state["fc.weight"].shape[1]
    stated = cfg_json.get("target_hidden_size") or _layer_cfg_from(cfg_json).get("target_hidden_size")
    hint = "" if stated else (" (the config has no target_hidden_size, so the draft's own hidden size was "
                              "assumed)")
    if fc_in % cfg.target_hidden_size:
        raise DraftFormatError(f"fc.weight is {tuple(state['fc.weight'].shape)}; its input width {fc_in} is "
                               f"not a multiple of the target hidden size {cfg.target_hidden_size}{hint}")
    if target is not None and hint and cfg.target_hidden_size != target.config.hidden_size:
        raise DraftFormatError(f"draft expects target hidden size {cfg.target_hidden_size}; the target has "
                               f"{target.config.hidden_size}{hint}; fc.weight is "
                               f"{tuple(state['fc.weight'].shape)}")
    cfg.num_aux = fc_in // cfg.target_hidden_size
    own_embedding = "embed_tokens.weight" in state
    if target is not None:
        check_fits_target(cfg, target, has_own_embedding=own_embedding)
    with torch.device("meta"):      # no random init: a 7168-wide draft would hold its weights twice
        draft = Eagle3Draft(cfg)
    if not own_embedding:
        if target is None:
            raise DraftFormatError("the draft has no embed_tokens; pass the target to borrow its embedding")
        state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().to(dtype, copy=True)
    state["d2t"], state["t2d"] = _vocab_buffers(state, cfg, source)
    expected = draft.state_dict()
    wrong = [f"{k} {tuple(v.shape)} (config implies {tuple(expected[k].shape)})"
             for k, v in state.items() if k in expected and tuple(v.shape) != tuple(expected[k].shape)]
    if wrong:
        raise DraftFormatError(f"draft weights disagree with {path / 'config.json'}: " + "; ".join(wrong))
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise DraftFormatError(
            f"{source} does not match an EAGLE-3 draft: missing {missing}, unexpected {unexpected} (expected "
            f"fc.weight, norm.weight, lm_head.weight, one decoder layer under midlayer.* or layers.0.*, "
            f"optionally embed_tokens.weight, d2t, t2d)")
    del raw                         # the state holds the same tensors; converting one at a time frees each
    for k in list(state):
        if state[k].is_floating_point():
            state[k] = state[k].to(dtype)
    draft.load_state_dict(state, assign=True)
    draft.embed_tokens.weight.requires_grad_(False)
    if cfg.norm_before_residual:
        warnings.warn(f"{path}: {NORM_BEFORE_RESIDUAL_ON_SGLANG} Evaluate what SGLang runs by setting "
                      f"draft.cfg.norm_before_residual = False.", ServingMismatchWarning, stacklevel=2)
    return draft.to(device=device, dtype=dtype).eval()


def check_vocab_map(d2t: torch.Tensor, cfg: DraftConfig) -> None:
    if d2t.numel() != cfg.draft_vocab_size:
        raise DraftFormatError(f"d2t has {d2t.numel()} entries; draft_vocab_size is {cfg.draft_vocab_size}")
    ids = d2t + torch.arange(d2t.numel())
    bad = ((ids < 0) | (ids >= cfg.vocab_size)).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        raise DraftFormatError(f"d2t maps draft id {i} to target id {int(ids[i])}, outside the target "
                               f"vocabulary 0..{cfg.vocab_size - 1}")


def check_fits_target(cfg: DraftConfig, target, has_own_embedding: bool = False) -> None:
    """A draft may be narrower or wider than its target (``target_hidden_size`` set, fc input
    n x target width); then it cannot borrow the target's embedding and must ship its own."""
    tcfg = target.config
    th = tcfg.hidden_size
    tv = tcfg.vocab_size
    if cfg.target_hidden_size != th:
        raise DraftFormatError(f"draft expects target hidden size {cfg.target_hidden_size}; the target has "
                               f"{th}")
    if cfg.num_aux * th != cfg.fc_in or cfg.num_aux < 1:
        raise DraftFormatError(f"draft fc input {cfg.fc_in} is not a multiple of the target hidden size {th}")
    if cfg.vocab_size != tv:
        raise DraftFormatError(f"draft vocab_size is {cfg.vocab_size}; the target's vocabulary has {tv} "
                               f"tokens")
    width = target.get_input_embeddings().weight.shape[1]
    if cfg.hidden_size != width and not has_own_embedding:
        raise DraftFormatError(
            f"draft hidden size {cfg.hidden_size} differs from the target's embedding width {width}, so it "
            f"cannot share it: expected the checkpoint to ship its own embed_tokens.weight "
            f"[{cfg.vocab_size}, {cfg.hidden_size}]; it has none")


def read_training_record(path: str | Path) -> dict | None:
    """``training.json`` beside a draft built here: its training layout and metric log."""
    f = Path(path) / "training.json"
    if not f.is_file():
        return None
    record = read_json_file(f, "training record")
    if not isinstance(record, dict):
        raise BadConfig(f"{f} holds a JSON {type(record).__name__}; expected an object (a training record)")
    return record


def new_draft_config(target_cfg, draft_vocab_size: int, eagle_ids: list[int],
                     num_aux: int = 3) -> DraftConfig:
    h = target_cfg.hidden_size
    return DraftConfig(hidden_size=h, intermediate_size=3 * h, num_attention_heads=4, num_key_value_heads=4,
                       head_dim=h // 4, vocab_size=target_cfg.vocab_size, draft_vocab_size=draft_vocab_size,
                       target_hidden_size=h, num_aux=num_aux, eagle_ids=list(eagle_ids))


def as_dict(cfg: DraftConfig) -> dict:
    return asdict(cfg)
