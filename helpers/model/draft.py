"""The EAGLE-3 draft: the module, its KV cache, and its forward as each engine runs it (its checkpoint
formats are ``model.checkpoint``).

Shape of the model (as SGLang's ``LlamaForCausalLMEagle3`` runs it): ``fc`` folds the
target's fused feature (width n*H_target) to H; one decoder layer attends over
``cat(input_layernorm(embed), hidden_norm(h))`` (width 2H); the pre-norm output is both
what the next draft step is fed and, after ``norm`` and ``lm_head``, a distribution over a
reduced *draft vocabulary* mapped back with ``d2t`` (``target_id = draft_id + d2t[id]``).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import BadCheckpoint
from ..rules.conventions import (
    MLA_DRAFT_ARCH,
    SGLANG_DRAFT_ARCH,
    Engine,
    IdsAt,
    expect_engine,
)
from ..rules.flags import FORWARD_FLAGS, flag_fix, honours_flag

SGLANG_ARCH = SGLANG_DRAFT_ARCH


class DraftFormatError(BadCheckpoint):
    """A draft checkpoint that does not fit the target or is not an EAGLE-3 draft."""


class ServingMismatchWarning(UserWarning):
    """The draft loads and runs here, but an engine would run it with a different forward."""


def _flag_rules(draft, engine: Engine) -> list[tuple[str, bool | None, str]]:
    """(flag, honoured, why) for each forward flag the draft was trained with (``honours_flag``): the
    first step of ``run_as``, ``ignored_flags`` and ``forward_verdict``."""
    expect_engine(engine)
    return [(flag, *honours_flag(engine, flag, draft.cfg.arch, draft.cfg.format == "speculators"))
            for flag in FORWARD_FLAGS if getattr(draft.cfg, flag)]


def ignored_flags(draft, engine: Engine) -> list[tuple[str, str]]:
    """(flag, why) for each flag the draft was trained with that ``engine``'s draft file never runs:
    what ``run_as`` switches off, for a verdict to name."""
    return [(flag, why) for flag, honoured, why in _flag_rules(draft, engine) if honoured is False]


def forward_verdict(draft, engine: Engine) -> tuple[list[str], str | None]:
    """What a verdict says of the engine's forward: one phrase per ignored flag, and the releases that
    run them all (``rules.flags.flag_fix``)."""
    ignored = ignored_flags(draft, engine)
    if not ignored:
        return [], None
    phrases = [f"{flag} ignored: {why}" for flag, why in ignored]
    return phrases, flag_fix([flag for flag, _ in ignored], draft.cfg.arch, draft.cfg.format == "speculators")


@contextmanager
def run_as(draft, engine: Engine):
    """Run ``draft`` the way ``engine`` runs it, for the duration of the block.

    Emulating a deployment means emulating the engine's forward too, not only its wiring: a
    release whose draft class never reads a flag the draft was trained with (SGLang's
    llama_eagle3 and norm_before_residual; SGLang before 0.5.17 and norm_before_fc; the MLA
    classes and norm_before_fc) builds the module without it, so the flag is switched off here.
    The rules are ``rules.flags.honours_flag``'s (docs/conventions.md, "Forward flags").
    Yields notes saying what was switched, for the reports.
    """
    saved = {f: getattr(draft.cfg, f) for f in FORWARD_FLAGS}
    notes = []
    for flag, honoured, why in _flag_rules(draft, engine):
        if honoured is False:
            setattr(draft.cfg, flag, False)
            notes.append(f"run as {engine} runs it: {flag} ignored (the draft was trained with it; {why})")
        elif honoured is None:
            notes.append(f"{flag}: {why}; run with it, as trained")
    try:
        yield notes
    finally:
        for flag, on in saved.items():
            setattr(draft.cfg, flag, on)


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
    # EAGLE 3.1 flags (docs/conventions.md, "Forward flags"): one RMSNorm (input_norm) over the whole
    # fused feature before fc; one RMSNorm per slot (fc_norm.i); the post-norm state fed back.
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    arch: str = SGLANG_DRAFT_ARCH            # the config's class: decides which engine file runs it
    # MLA attention (Eagle3DeepseekV2ForCausalLM); kv_lora_rank 0 means the Llama attention.
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = True
    rope_scaling: dict | None = None

    @property
    def fc_in(self) -> int:
        return self.num_aux * self.target_hidden_size

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def cache_dims(self) -> tuple[int, int, int]:
        """(kv heads, key width, value width) one cached column holds. MLA is cached expanded
        (keys and values per head, as the un-absorbed forward computes them): equal to what the
        engines' absorbed latent cache computes, and simple to crop."""
        if self.mla:
            return self.num_attention_heads, self.qk_nope_head_dim + self.qk_rope_head_dim, self.v_head_dim
        return self.num_key_value_heads, self.head_dim, self.head_dim


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


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float, inv: torch.Tensor | None = None):
    if inv is None:
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32,
                                            device=positions.device) / head_dim))
    ang = positions.float()[..., None] * inv.to(positions.device)
    emb = torch.cat([ang, ang], -1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    # x: [B, heads, T, D]; cos/sin: [B, T, D]
    cos, sin = cos[:, None], sin[:, None]
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


def apply_rope_interleaved(x, cos, sin):
    """DeepSeek's default (``rope_interleave``, SGLang/vLLM ``is_neox_style=False``): dims 2i and
    2i + 1 turn together. Written as a permutation to the half-split form and back."""
    d = x.shape[-1]
    perm = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)]).to(x.device)
    out = apply_rope(x[..., perm], cos, sin)
    return out[..., torch.argsort(perm)]


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def mla_rope(cfg: DraftConfig) -> tuple[torch.Tensor, float, float]:
    """(inverse frequencies, cos/sin factor, softmax-scale factor) of an MLA draft's rotary part.

    ``rope_scaling`` of type yarn (Kimi-K2.x drafts: factor 64) is DeepSeek's YaRN as SGLang's
    ``deepseek_yarn`` rope and ``compute_mla_mscale_scaling`` and vLLM's DeepSeek YaRN apply it:
    frequencies blended between interpolated and extrapolated by a linear ramp over the
    correction range, cos/sin scaled by mscale(mscale)/mscale(mscale_all_dim), the softmax
    scale by mscale(mscale_all_dim)^2 (docs/conventions.md, "MLA drafts").
    """
    d, base = cfg.qk_rope_head_dim, cfg.rope_theta
    # explicit cpu: built under load_draft's meta device, and kept out of the state dict
    extra = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32, device="cpu") / d))
    rs = cfg.rope_scaling or {}
    kind = rs.get("rope_type") or rs.get("type") or "default"
    if kind == "default":
        return extra, 1.0, 1.0
    if kind not in ("yarn", "deepseek_yarn"):
        raise DraftFormatError(f"MLA draft rope_scaling type {kind!r}; expected none or yarn (as "
                               f"DeepSeek/Kimi drafts ship)")
    factor = float(rs["factor"])
    orig = float(rs.get("original_max_position_embeddings", 4096))
    fast, slow = float(rs.get("beta_fast", 32)), float(rs.get("beta_slow", 1))

    def corr(rot):
        return d * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(corr(fast)), 0), min(math.ceil(corr(slow)), d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    keep = 1.0 - ramp                      # 1: extrapolate (high frequencies), 0: interpolate
    inv = extra / factor * (1 - keep) + extra * keep
    m, m_all = float(rs.get("mscale", 1.0)), float(rs.get("mscale_all_dim", 0.0))
    cos_sin = _yarn_mscale(factor, m) / _yarn_mscale(factor, m_all) * float(rs.get("attn_factor", 1.0))
    return inv, cos_sin, _yarn_mscale(factor, m_all) ** 2 if m_all else 1.0


class DraftKVCache:
    """Keys/values of the draft's one layer, cropped back after each speculation round.

    Entries come from two sources: columns fed the target's features (kept), and the
    draft's own chain steps (discarded by ``crop`` once the target has verified them).
    """

    def __init__(self, cfg: DraftConfig, batch: int = 1, max_len: int = 2048, device="cpu",
                 dtype=torch.float32):
        heads, kd, vd = cfg.cache_dims
        self.k = torch.zeros((batch, heads, max_len, kd), device=device, dtype=dtype)
        self.v = torch.zeros((batch, heads, max_len, vd), device=device, dtype=dtype)
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
    """Llama attention over the 2H-wide ``cat(embeds, hidden)``; ``MLAAttention`` shares the two
    forward paths and changes only how queries, keys and values are made."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.cfg = cfg
        h2 = 2 * cfg.hidden_size
        self.q_proj = nn.Linear(h2, cfg.num_attention_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(h2, cfg.num_key_value_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(h2, cfg.num_key_value_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.scale = 1.0 / math.sqrt(cfg.head_dim)

    def qkv(self, x, positions):
        b, t, _ = x.shape
        c = self.cfg
        q = self.q_proj(x).view(b, t, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        cos, sin = rope_tables(positions, c.head_dim, c.rope_theta)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _expand(self, kv):
        rep = self.cfg.num_attention_heads // kv.shape[1]
        return kv.repeat_interleave(rep, dim=1) if rep > 1 else kv

    def _out(self, out, b, t):
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))

    def forward_cached(self, x, positions, cache: DraftKVCache):
        """Decode/extend: new queries attend to every cached entry and causally to each other."""
        q, k, v = self.qkv(x, positions)
        past = cache.length
        keys, vals = cache.append(k, v)
        t = x.shape[1]
        mask = torch.ones(t, past + t, dtype=torch.bool, device=x.device).tril(diagonal=past)
        out = F.scaled_dot_product_attention(q, self._expand(keys), self._expand(vals), attn_mask=mask,
                                             scale=self.scale)
        return self._out(out, x.shape[0], t)

    def forward_ttt(self, x, positions, past_kv: list[tuple[torch.Tensor, torch.Tensor]]):
        """Training-time test: column t of step j sees step-0 keys 0..t and its own column
        at steps 1..j -- exactly what a chain step sees at inference after ``crop``."""
        q, k, v = self.qkv(x, positions)
        past_kv.append((k, v))
        if len(past_kv) == 1:  # step 0 is plain causal attention: let SDPA do it
            out = F.scaled_dot_product_attention(q, self._expand(k), self._expand(v), is_causal=True,
                                                 scale=self.scale)
            return self._out(out, x.shape[0], x.shape[1])
        k0, v0 = self._expand(past_kv[0][0]), self._expand(past_kv[0][1])
        t = x.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        s0 = (q @ k0.transpose(-1, -2)) * self.scale
        s0 = s0.masked_fill(~causal, float("-inf"))
        diag = [(q * self._expand(kj)).sum(-1, keepdim=True) * self.scale for kj, _ in past_kv[1:]]
        scores = torch.cat([s0] + diag, -1).softmax(-1)
        out = scores[..., :t] @ v0
        for j, (_, vj) in enumerate(past_kv[1:]):
            out = out + scores[..., t + j:t + j + 1] * self._expand(vj)
        return self._out(out, x.shape[0], t)


class MLAAttention(DraftAttention):
    """DeepSeek-V2 multi-latent attention over ``cat(embeds, hidden)``, as SGLang's
    ``kimi_k25_eagle3.Eagle3MLADecoderLayer`` and vLLM's ``deepseek_eagle3`` build it: a 2H-wide
    query down-projection ``q_a_proj`` (or a full ``q_proj`` without ``q_lora_rank``),
    ``kv_a_proj_with_mqa`` to the latent plus one shared rotary key, both latents RMS-normed, then
    ``kv_b_proj`` to per-head non-rotary keys and values. Weights keep the names published
    checkpoints use (SGLang fuses q_a/kv_a at load; the arithmetic is the same)."""

    def __init__(self, cfg: DraftConfig):
        nn.Module.__init__(self)
        self.cfg = cfg
        h2, nh = 2 * cfg.hidden_size, cfg.num_attention_heads
        qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        if cfg.q_lora_rank:
            self.q_a_proj = nn.Linear(h2, cfg.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, nh * qk, bias=False)
        else:
            self.q_proj = nn.Linear(h2, nh * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h2, cfg.kv_lora_rank + cfg.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, nh * (cfg.qk_nope_head_dim + cfg.v_head_dim), bias=False)
        self.o_proj = nn.Linear(nh * cfg.v_head_dim, cfg.hidden_size, bias=False)
        self.inv_freq, self.cos_sin_scale, soft = mla_rope(cfg)   # a plain attribute: no checkpoint has it
        self.scale = qk ** -0.5 * soft

    def qkv(self, x, positions):
        b, t, _ = x.shape
        c = self.cfg
        nh, nope, rope = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim
        q = (self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if c.q_lora_rank else self.q_proj(x))
        q = q.view(b, t, nh, nope + rope).transpose(1, 2)
        latent = self.kv_a_proj_with_mqa(x)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent[..., :c.kv_lora_rank]))
        kv = kv.view(b, t, nh, nope + c.v_head_dim).transpose(1, 2)
        k_pe = latent[..., c.kv_lora_rank:].view(b, 1, t, rope)
        cos, sin = rope_tables(positions, rope, c.rope_theta, self.inv_freq)
        cos, sin = cos * self.cos_sin_scale, sin * self.cos_sin_scale
        turn = apply_rope_interleaved if c.rope_interleave else apply_rope
        q_pe, k_pe = turn(q[..., nope:], cos, sin), turn(k_pe, cos, sin)
        k = torch.cat([kv[..., :nope], k_pe.expand(b, nh, t, rope)], -1)
        return torch.cat([q[..., :nope], q_pe], -1), k, kv[..., nope:]


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
        self.self_attn = MLAAttention(cfg) if cfg.mla else DraftAttention(cfg)
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
        if cfg.norm_before_fc:
            self.input_norm = RMSNorm(cfg.fc_in, cfg.rms_norm_eps)
        if cfg.fc_norm:
            self.fc_norm = nn.ModuleList(RMSNorm(cfg.target_hidden_size, cfg.rms_norm_eps)
                                         for _ in range(cfg.num_aux))
        self.fc = nn.Linear(cfg.fc_in, cfg.hidden_size, bias=False)
        self.midlayer = DraftLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))

    # -- the two ways in ---------------------------------------------------------------

    def project(self, hidden):
        """The fused target feature goes through ``fc`` (after ``input_norm`` / ``fc_norm`` when the
        draft has them and the engine runs them: the module is built with them, ``cfg`` says whether
        they run, as ``run_as`` sets it); the draft's own state does not."""
        if hidden.shape[-1] == self.cfg.hidden_size and self.cfg.fc_in != self.cfg.hidden_size:
            return hidden
        if hidden.shape[-1] != self.cfg.fc_in:
            raise DraftFormatError(
                f"draft fed a feature of width {hidden.shape[-1]}; its fc expects {self.cfg.fc_in} "
                f"({self.cfg.num_aux} x {self.cfg.target_hidden_size}) or its own width "
                f"{self.cfg.hidden_size}")
        if self.cfg.norm_before_fc:
            hidden = self.input_norm(hidden)
        if self.cfg.fc_norm:
            hidden = torch.cat([n(c) for n, c in zip(self.fc_norm, hidden.chunk(self.cfg.num_aux, -1))], -1)
        return self.fc(hidden)

    def slot_project(self, x: torch.Tensor, slot: int) -> torch.Tensor:
        """Slot ``slot``'s share of ``project`` for one state ``x`` [..., H_target], so a layout
        search sums shares instead of re-running ``fc`` per layout.

        ``fc`` is linear, so shares add up exactly; ``fc_norm`` normalises each slot on its own, so
        it folds into the share. ``input_norm`` divides the whole fused vector by one RMS, which no
        single slot knows: the share then carries the slot's sum of squares as a last column (sums
        of shares sum it too) and ``finish_projected`` divides by the RMS. Sums of shares go to
        ``ttt_forward(..., projected=True)``."""
        ht = self.cfg.target_hidden_size
        w = self.fc.weight[:, slot * ht:(slot + 1) * ht]
        if self.cfg.fc_norm:
            x = self.fc_norm[slot](x)
        if not self.cfg.norm_before_fc:
            return x @ w.T
        g = self.input_norm.weight[slot * ht:(slot + 1) * ht]
        xf = x.float()
        share = (xf * g.float()).to(w.dtype) @ w.T
        return torch.cat([share, xf.pow(2).sum(-1, keepdim=True).to(w.dtype)], -1)

    def finish_projected(self, h: torch.Tensor) -> torch.Tensor:
        """A sum of ``slot_project`` shares -> what ``project`` gives for the fused feature."""
        if not self.cfg.norm_before_fc or h.shape[-1] != self.cfg.hidden_size + 1:
            return h
        rms = torch.rsqrt(h[..., -1:].float() / self.cfg.fc_in + self.cfg.rms_norm_eps)
        return (h[..., :-1].float() * rms).to(h.dtype)

    def _fed_back(self, out):
        """(logits, the state the next draft step is fed): the pre-norm layer output, or with
        ``norm_output`` the post-norm one (SGLang and vLLM return it as the aux output)."""
        normed = self.norm(out)
        return self.lm_head(normed), normed if self.cfg.norm_output else out

    def step(self, input_ids, hidden, positions, cache: DraftKVCache):
        """Cached forward of new columns -> (draft-vocab logits, state to feed back)."""
        h = self.project(hidden)
        embeds = self.embed_tokens(input_ids).to(h.dtype)
        out = self.midlayer(embeds, h, lambda x: self.midlayer.self_attn.forward_cached(x, positions, cache))
        return self._fed_back(out)

    def ttt_forward(self, input_ids, fused, steps: int, projected: bool = False):
        """Teacher-forced unroll over ``steps`` draft steps; returns logits per step.

        Step j at column t is fed token ``input_ids[t + 1 + j]`` and, for j > 0, the state
        step j-1 produced at column t. Logits of step j predict the target's next token at
        position ``t + 1 + j``; columns past the end are padded and must be masked by the caller.
        ``projected`` says ``fused`` is a sum of ``slot_project`` shares (the layout search sums
        per-slot projections instead of re-running ``fc`` for every layout).
        """
        b, t = input_ids.shape
        h = self.finish_projected(fused) if projected else self.project(fused)
        past_kv: list = []
        base = torch.arange(t, device=input_ids.device).expand(b, t)
        pad = torch.zeros(b, steps + 1, dtype=input_ids.dtype, device=input_ids.device)
        ids = torch.cat([input_ids, pad], 1)
        all_logits = []
        for j in range(steps):
            embeds = self.embed_tokens(ids[:, 1 + j:1 + j + t]).to(h.dtype)
            pos = base + j
            out = self.midlayer(embeds, h, lambda x: self.midlayer.self_attn.forward_ttt(x, pos, past_kv))
            logits, h = self._fed_back(out)
            all_logits.append(logits)
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


# A small MLA attention in the proportions of the Kimi-K2.5 MLA drafts (kv_lora_rank 512 and q_lora_rank
# 1536 at width 7168; nope 128, rope 64, v 128 per head) and their YaRN rope (factor 64 over 4096).
KIMI_YARN = {"type": "yarn", "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 1.0,
             "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0}


def mla_variant(hidden: int, heads: int = 4, rope_scaling: dict | None = None) -> dict:
    """``new_draft_config`` keywords for an MLA draft of width ``hidden`` (the workbook's tiny ones)."""
    d = hidden // heads
    return {"arch": MLA_DRAFT_ARCH, "q_lora_rank": max(hidden // 4, 8), "kv_lora_rank": max(hidden // 8, 8),
            "qk_nope_head_dim": d // 2, "qk_rope_head_dim": max(d // 4, 2), "v_head_dim": d // 2,
            "rope_scaling": dict(KIMI_YARN if rope_scaling is None else rope_scaling)}


def new_draft_config(target_cfg, draft_vocab_size: int, eagle_ids: list[int],
                     num_aux: int = 3, **variant) -> DraftConfig:
    """``variant``: DraftConfig fields of a draft variant (forward flags, ``mla_variant(...)``)."""
    h = target_cfg.hidden_size
    return DraftConfig(hidden_size=h, intermediate_size=3 * h, num_attention_heads=4, num_key_value_heads=4,
                       head_dim=h // 4, vocab_size=target_cfg.vocab_size, draft_vocab_size=draft_vocab_size,
                       target_hidden_size=h, num_aux=num_aux, eagle_ids=list(eagle_ids), **variant)


def as_dict(cfg: DraftConfig) -> dict:
    return asdict(cfg)
