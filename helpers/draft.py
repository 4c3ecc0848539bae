"""The EAGLE-3 draft: module, KV cache, and both checkpoint formats real drafts ship in.

Shape of the model (as SGLang's ``LlamaForCausalLMEagle3`` runs it): ``fc`` folds the
target's fused feature (width n*H_target) to H; one decoder layer attends over
``cat(input_layernorm(embed), hidden_norm(h))`` (width 2H); the pre-norm output is both
what the next draft step is fed and, after ``norm`` and ``lm_head``, a distribution over a
reduced *draft vocabulary* mapped back with ``d2t`` (``target_id = draft_id + d2t[id]``).

Formats read and written:
- SGLang / SpecForge: ``architectures: ["LlamaForCausalLMEagle3"]``, ids under
  ``eagle_config.eagle_aux_hidden_state_layer_ids``, weights ``midlayer.*``.
- speculators: ``architectures: ["Eagle3Speculator"]``, ``transformer_layer_config``,
  top-level ``eagle_aux_hidden_state_layer_ids``, weights ``layers.0.*``.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

SGLANG_ARCH = "LlamaForCausalLMEagle3"
SPECULATORS_ARCH = "Eagle3Speculator"


class DraftFormatError(ValueError):
    """A draft checkpoint that does not fit the target or is not an EAGLE-3 draft."""


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
    ids_location: str = "eagle_config"       # where the file held them: eagle_config | top_level | none
    format: str = "sglang"

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
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
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

    def __init__(self, cfg: DraftConfig, batch: int = 1, max_len: int = 2048, device="cpu", dtype=torch.float32):
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
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DraftMLP(cfg)

    def forward(self, embeds, hidden, attend):
        residual = hidden
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], -1)
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
                f"({self.cfg.num_aux} x {self.cfg.target_hidden_size}) or its own width {self.cfg.hidden_size}")
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
        raise DraftFormatError(f"draft vocabulary holds target id {int(bad[0])}; target ids run 0..{vocab_size - 1}")
    d2t = ids - torch.arange(ids.numel())
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return d2t, t2d


# --------------------------------------------------------------------------------------
# Checkpoint formats


def _layer_cfg_from(cfg_json: dict) -> dict:
    return cfg_json.get("transformer_layer_config") or cfg_json


def read_draft_config(path: str | Path) -> dict:
    path = Path(path)
    f = path / "config.json"
    if not f.is_file():
        raise FileNotFoundError(f"no draft at {path}: expected config.json and model.safetensors")
    return json.loads(f.read_text())


def draft_format(cfg_json: dict) -> str:
    arch = (cfg_json.get("architectures") or [""])[0]
    if arch == SPECULATORS_ARCH or cfg_json.get("speculators_model_type") == "eagle3":
        return "speculators"
    if "eagle3" in arch.lower() or "eagle_config" in cfg_json:
        return "sglang"
    raise DraftFormatError(f"config architectures {cfg_json.get('architectures')} is not an EAGLE-3 draft "
                           f"(expected {SGLANG_ARCH} or {SPECULATORS_ARCH})")


def eagle_ids_of(cfg_json: dict) -> tuple[list[int] | None, str]:
    """The layer ids a config carries, and where: ``eagle_config``, ``top_level`` or ``none``."""
    nested = (cfg_json.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if nested is not None:
        return [int(i) for i in nested], "eagle_config"
    top = cfg_json.get("eagle_aux_hidden_state_layer_ids")
    if top is not None:
        return [int(i) for i in top], "top_level"
    return None, "none"


def config_from_json(cfg_json: dict) -> DraftConfig:
    fmt = draft_format(cfg_json)
    layer = _layer_cfg_from(cfg_json)
    h = layer["hidden_size"]
    heads = layer["num_attention_heads"]
    ids, where = eagle_ids_of(cfg_json)
    rope = layer.get("rope_parameters") or layer.get("rope_scaling") or {}
    theta = layer.get("rope_theta") or rope.get("rope_theta") or 10000.0
    return DraftConfig(
        hidden_size=h, intermediate_size=layer["intermediate_size"], num_attention_heads=heads,
        num_key_value_heads=layer.get("num_key_value_heads") or heads,
        head_dim=layer.get("head_dim") or h // heads,
        vocab_size=cfg_json.get("vocab_size") or layer["vocab_size"],
        draft_vocab_size=cfg_json.get("draft_vocab_size") or layer.get("draft_vocab_size") or layer["vocab_size"],
        target_hidden_size=cfg_json.get("target_hidden_size") or layer.get("target_hidden_size") or h,
        num_aux=int(cfg_json.get("num_aux_hidden_states", 3)),
        rms_norm_eps=layer.get("rms_norm_eps", 1e-6), rope_theta=float(theta),
        max_position_embeddings=layer.get("max_position_embeddings", 2048),
        eagle_ids=ids, ids_location=where, format=fmt,
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
        out = {"architectures": [SGLANG_ARCH], **_llama_layer_json(cfg), "draft_vocab_size": cfg.draft_vocab_size,
               "target_hidden_size": cfg.target_hidden_size}
        if cfg.eagle_ids is not None:
            out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(cfg.eagle_ids),
                                   "use_aux_hidden_state": True}
    elif fmt == "speculators":
        out = {"architectures": [SPECULATORS_ARCH], "speculators_model_type": "eagle3",
               "transformer_layer_config": _llama_layer_json(cfg), "draft_vocab_size": cfg.draft_vocab_size,
               "target_hidden_size": cfg.target_hidden_size, "norm_before_residual": False,
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
               dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write ``config.json`` + ``model.safetensors``; the embedding stays with the target."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prefix = _layer_prefix(fmt)
    tensors = {}
    for name, t in draft.state_dict().items():
        if name.startswith("embed_tokens."):
            continue
        key = prefix + name[len("midlayer."):] if name.startswith("midlayer.") else name
        tensors[key] = t.detach().to(dtype).contiguous() if t.is_floating_point() else t.contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg_json = config_to_json(draft.cfg, fmt, extra_config)
    (out / "config.json").write_text(json.dumps(cfg_json, indent=2) + "\n")
    return out


def load_draft(path: str | Path, target=None, device="cpu", dtype=torch.float32) -> Eagle3Draft:
    """Read either format. ``target`` supplies the embedding (and is checked for fit)."""
    path = Path(path)
    cfg_json = read_draft_config(path)
    cfg = config_from_json(cfg_json)
    wfile = path / "model.safetensors"
    if not wfile.is_file():
        raise FileNotFoundError(f"no weights at {wfile}")
    raw = load_file(str(wfile))
    prefix = _layer_prefix(cfg.format)
    state = {}
    for k, v in raw.items():
        if k.startswith(prefix):
            k = "midlayer." + k[len(prefix):]
        state[k] = v
    if "fc.weight" not in state:
        raise DraftFormatError(f"{wfile} has no fc.weight; keys start {sorted(state)[:5]}")
    fc_in = state["fc.weight"].shape[1]
    if fc_in % cfg.target_hidden_size:
        raise DraftFormatError(f"fc.weight is {tuple(state['fc.weight'].shape)}; its input width {fc_in} is not a "
                               f"multiple of the target hidden size {cfg.target_hidden_size}")
    cfg.num_aux = fc_in // cfg.target_hidden_size
    if target is not None:
        check_fits_target(cfg, target)
    draft = Eagle3Draft(cfg)
    if "embed_tokens.weight" not in state:
        if target is None:
            raise DraftFormatError("the draft has no embed_tokens; pass the target to borrow its embedding")
        state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().float()
    if "d2t" not in state:
        state["d2t"] = torch.zeros(cfg.draft_vocab_size, dtype=torch.long)
        state["t2d"] = torch.ones(cfg.vocab_size, dtype=torch.bool)
    state["d2t"] = state["d2t"].long()
    state["t2d"] = state["t2d"].bool()
    check_vocab_map(state["d2t"], cfg)
    expected = draft.state_dict()
    wrong = [f"{k} {tuple(v.shape)} (config implies {tuple(expected[k].shape)})"
             for k, v in state.items() if k in expected and tuple(v.shape) != tuple(expected[k].shape)]
    if wrong:
        raise DraftFormatError(f"draft weights disagree with {path / 'config.json'}: " + "; ".join(wrong))
    missing, unexpected = draft.load_state_dict({k: v.float() if v.is_floating_point() else v
                                                 for k, v in state.items()}, strict=False)
    if missing or unexpected:
        raise DraftFormatError(f"draft weights do not match an EAGLE-3 layer: missing {missing}, unexpected {unexpected}")
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


def check_fits_target(cfg: DraftConfig, target) -> None:
    tcfg = target.config
    th = tcfg.hidden_size
    tv = tcfg.vocab_size
    if cfg.target_hidden_size != th:
        raise DraftFormatError(f"draft expects target hidden size {cfg.target_hidden_size}; the target has {th}")
    if cfg.num_aux * th != cfg.fc_in or cfg.num_aux < 1:
        raise DraftFormatError(f"draft fc input {cfg.fc_in} is not a multiple of the target hidden size {th}")
    if cfg.vocab_size != tv:
        raise DraftFormatError(f"draft vocab_size is {cfg.vocab_size}; the target's vocabulary has {tv} tokens")
    if cfg.hidden_size != target.get_input_embeddings().weight.shape[1]:
        raise DraftFormatError(f"draft hidden size {cfg.hidden_size} differs from the target's embedding width "
                               f"{target.get_input_embeddings().weight.shape[1]}, so it cannot share it")


def read_training_record(path: str | Path) -> dict | None:
    """``training.json`` beside a draft built here: its training layout and metric log."""
    f = Path(path) / "training.json"
    return json.loads(f.read_text()) if f.is_file() else None


def new_draft_config(target_cfg, draft_vocab_size: int, eagle_ids: list[int], num_aux: int = 3) -> DraftConfig:
    h = target_cfg.hidden_size
    return DraftConfig(hidden_size=h, intermediate_size=3 * h, num_attention_heads=4, num_key_value_heads=4,
                       head_dim=h // 4, vocab_size=target_cfg.vocab_size, draft_vocab_size=draft_vocab_size,
                       target_hidden_size=h, num_aux=num_aux, eagle_ids=list(eagle_ids))


def as_dict(cfg: DraftConfig) -> dict:
    return asdict(cfg)
