"""Draft variants as the engines define them: MLA attention (``Eagle3DeepseekV2ForCausalLM``), one
RMSNorm over the fused feature before ``fc`` (``norm_before_fc``, weights ``input_norm.weight``),
one per slot (``fc_norm``), the post-norm state fed back (``norm_output``), and fc widths other
than 3 slots.

Each is built small with random weights, saved in the layout real checkpoints use, loaded back and
run; the forward is compared with an independent float64 re-implementation of the engines' math
(SGLang ``kimi_k25_eagle3.py`` / ``llama_eagle3.py``, vLLM ``deepseek_eagle3.py`` /
``llama_eagle3.py``; docs/conventions.md "Forward flags"), written row by row below. Then the
scoring paths (layout search, dump scoring, ``diagnose``) and ``check`` are run on them.
"""
from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open

from helpers.investigation.gate import check
from helpers.model.checkpoint import load_draft, save_draft
from helpers.model.draft import (
    MLA_DRAFT_ARCH,
    DraftFormatError,
    DraftKVCache,
    Eagle3Draft,
    mla_variant,
    new_draft_config,
    run_as,
    vocab_maps,
)
from helpers.rules.conventions import parse_engine
from helpers.rules.conventions import parse_engine as E
from helpers.rules.flags import honours_flag, ignored_flag_problems

H, VOCAB, DV = 32, 128, 64
ROOT = Path(__file__).resolve().parent.parent
TINY_KIMI = ROOT / "data" / "tiny-kimi"

NO_YARN = {"type": "default"}
VARIANTS = {
    "k2": dict(num_aux=2),
    "k4": dict(num_aux=4),
    "norm_before_fc": dict(norm_before_fc=True),
    "fc_norm": dict(fc_norm=True),
    "norm_output": dict(norm_output=True),
    "eagle31": dict(norm_before_fc=True, norm_output=True),
    "mla": dict(**mla_variant(H, rope_scaling=NO_YARN)),
    "mla_eagle31": dict(**mla_variant(H, rope_scaling=NO_YARN), fc_norm=True, norm_output=True),
    "mla_no_q_lora": dict(**{**mla_variant(H, rope_scaling=NO_YARN), "q_lora_rank": None}),
}


def _cfg_of(target, variant: dict):
    v = dict(variant)
    k = v.pop("num_aux", 3)
    return new_draft_config(target.config, DV, list(range(1, k + 1)), num_aux=k, **v)


def make_variant(target, variant: dict, seed: int = 0) -> Eagle3Draft:
    """Random weights; norm weights away from 1 so that a norm dropped or misplaced shows."""
    torch.manual_seed(seed)
    draft = Eagle3Draft(_cfg_of(target, variant))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.4 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
        draft.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
        ids = torch.sort(torch.randperm(VOCAB, generator=g)[:DV]).values
        draft.d2t.copy_(vocab_maps(ids, VOCAB)[0])
        draft.t2d.copy_(vocab_maps(ids, VOCAB)[1])
    return draft.eval()


@pytest.fixture(scope="module")
def target(make_tiny_lm):
    return make_tiny_lm("llama", seed=0, hidden=H, layers=3, vocab=VOCAB)


def _saved(target, tmp_path, name, fmt="sglang", seed=0):
    draft = make_variant(target, VARIANTS[name], seed)
    path = save_draft(draft, tmp_path / f"{name}-{fmt}", fmt=fmt, dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return draft, path, load_draft(path, target=target)


# -- independent float64 reference ------------------------------------------------------------------


def _rms(x, w, eps):
    return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def _turn(x, pos, inv, interleaved):
    """RoPE on [heads, D]: pairs (2i, 2i+1) when interleaved (DeepSeek), else (i, i + D/2)."""
    c, s = (pos * inv).cos(), (pos * inv).sin()
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * c - b * s, b * c + a * s
        return out
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * c - b * s, b * c + a * s], -1)


def reference_logits(draft, rows) -> torch.Tensor:
    """Rows of (token, position, source): a fused feature [k * H_t] or the index of an earlier row
    whose fed-back state (pre-norm output, or post-norm with norm_output) it is given."""
    c = draft.cfg
    w = {k: v.double() for k, v in draft.state_dict().items()}
    m, eps = "midlayer.", c.rms_norm_eps
    nh = c.num_attention_heads
    outs, logits, keys, vals = [], [], [], []
    for tok, pos, src in rows:
        if isinstance(src, int):
            h = outs[src]
        else:
            f = src.double()
            if c.norm_before_fc:                                  # one norm over the whole fused vector
                f = _rms(f, w["input_norm.weight"], eps)
            if c.fc_norm:                                         # one norm per slot
                f = torch.cat([_rms(x, w[f"fc_norm.{i}.weight"], eps)
                               for i, x in enumerate(f.split(c.target_hidden_size))])
            h = w["fc.weight"] @ f
        hn = _rms(h, w[m + "hidden_norm.weight"], eps)
        x = torch.cat([_rms(w["embed_tokens.weight"][tok], w[m + "input_layernorm.weight"], eps), hn])
        a = m + "self_attn."
        if c.mla:
            nope, rope, r = c.qk_nope_head_dim, c.qk_rope_head_dim, c.kv_lora_rank
            if c.q_lora_rank:
                q_a = _rms(w[a + "q_a_proj.weight"] @ x, w[a + "q_a_layernorm.weight"], eps)
                q = w[a + "q_b_proj.weight"] @ q_a
            else:
                q = w[a + "q_proj.weight"] @ x
            q = q.view(nh, nope + rope)
            lat = w[a + "kv_a_proj_with_mqa.weight"] @ x
            kv = w[a + "kv_b_proj.weight"] @ _rms(lat[:r], w[a + "kv_a_layernorm.weight"], eps)
            kv = kv.view(nh, -1)
            inv = torch.tensor([c.rope_theta ** (-2.0 * i / rope) for i in range(rope // 2)],
                               dtype=torch.float64)
            q = torch.cat([q[:, :nope], _turn(q[:, nope:], pos, inv, True)], -1)
            k_pe = _turn(lat[r:][None], pos, inv, True).expand(nh, rope)
            keys.append(torch.cat([kv[:, :nope], k_pe], -1))
            vals.append(kv[:, nope:])
            scale, group = (nope + rope) ** -0.5, 1
        else:
            hd, nkv = c.head_dim, c.num_key_value_heads
            inv = torch.tensor([c.rope_theta ** (-2.0 * i / hd) for i in range(hd // 2)],
                               dtype=torch.float64)
            q = _turn((w[a + "q_proj.weight"] @ x).view(nh, hd), pos, inv, False)
            keys.append(_turn((w[a + "k_proj.weight"] @ x).view(nkv, hd), pos, inv, False))
            vals.append((w[a + "v_proj.weight"] @ x).view(nkv, hd))
            scale, group = hd ** -0.5, nh // nkv
        heads = []
        for i in range(nh):
            p = (torch.stack([k[i // group] @ q[i] for k in keys]) * scale).softmax(0)
            heads.append(sum(pj * v[i // group] for pj, v in zip(p, vals)))
        resid = (hn if c.norm_before_residual else h) + w[a + "o_proj.weight"] @ torch.cat(heads)
        u = _rms(resid, w[m + "post_attention_layernorm.weight"], eps)
        gate = w[m + "mlp.gate_proj.weight"] @ u
        act = gate * torch.sigmoid(gate) * (w[m + "mlp.up_proj.weight"] @ u)
        out = resid + w[m + "mlp.down_proj.weight"] @ act
        normed = _rms(out, w["norm.weight"], eps)
        outs.append(normed if c.norm_output else out)
        logits.append(w["lm_head.weight"] @ normed)
    return torch.stack(logits)


def _inputs(draft, t=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (1, t + 2), generator=g)
    fused = torch.randn(1, t + 1, draft.cfg.fc_in, generator=g) * 3
    return ids, fused


def _engine_logits(draft, ids, fused, c):
    """Columns 0..c extended with the target's features, then one chain step at column c."""
    with torch.no_grad():
        cache = DraftKVCache(draft.cfg, 1, 32)
        lg0, state = draft.step(ids[:, 1:c + 2], fused[:, :c + 1], torch.arange(c + 1)[None], cache)
        lg1, _ = draft.step(ids[:, c + 2:c + 3], state[:, c:c + 1], torch.tensor([[c + 1]]), cache)
    return torch.cat([lg0[0], lg1[0]])


# -- load, layout, forward --------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_forward_matches_the_engines_math(target, tmp_path, name):
    """Saved in its checkpoint layout, loaded back: cached extend + chain step, and the
    teacher-forced unroll, both equal the row-by-row reference."""
    _, _, loaded = _saved(target, tmp_path, name)
    ids, fused = _inputs(loaded)
    c = 4
    rows = [(int(ids[0, 1 + t]), t, fused[0, t]) for t in range(c + 1)]
    rows.append((int(ids[0, c + 2]), c + 1, c))
    want = reference_logits(loaded, rows)
    got = _engine_logits(loaded, ids, fused, c).double()
    assert torch.allclose(got, want, atol=2e-4, rtol=1e-4), (got - want).abs().max()
    with torch.no_grad():
        ttt = loaded.ttt_forward(ids[:, :c + 3], fused[:, :c + 3], 2)
    assert torch.allclose(ttt[0][0, c].double(), want[c], atol=2e-4, rtol=1e-4)
    assert torch.allclose(ttt[1][0, c].double(), want[c + 1], atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_slot_shares_sum_to_the_projection(target, name):
    """What the layout search and dump scoring sum (draft.slot_project) equals running the norms
    and fc on the fused feature, input_norm's whole-vector RMS included."""
    draft = make_variant(target, VARIANTS[name])
    ids, fused = _inputs(draft)
    parts = fused.split(draft.cfg.target_hidden_size, -1)
    with torch.no_grad():
        a = draft.ttt_forward(ids[:, :-1], fused, 2)
        b = draft.ttt_forward(ids[:, :-1], sum(draft.slot_project(x, s) for s, x in enumerate(parts)), 2,
                              projected=True)
    for x, y in zip(a, b):
        assert torch.allclose(x, y, atol=1e-4)


def _keys(path):
    with safe_open(str(path / "model.safetensors"), framework="pt") as st:
        return set(st.keys())


def test_mla_checkpoint_layout_is_the_published_one(target, tmp_path):
    """As k-l-lambda/Kimi-K2.5-Eagle3 ships: the MLA architecture, DeepSeek attention keys in the
    config, midlayer.self_attn.{q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm,
    kv_b_proj, o_proj} in the weights (SGLang fuses q_a and kv_a at load)."""
    _, path, loaded = _saved(target, tmp_path, "mla_eagle31")
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == [MLA_DRAFT_ARCH] and cfg["model_type"] == "kimi_k2"
    assert {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"} <= set(cfg)
    assert cfg["fc_norm"] is True and cfg["norm_output"] is True
    keys = _keys(path)
    for k in ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj",
              "o_proj"):
        assert f"midlayer.self_attn.{k}.weight" in keys
    assert {"fc_norm.0.weight", "fc_norm.2.weight"} <= keys and "midlayer.self_attn.q_proj.weight" not in keys
    assert loaded.cfg.mla and loaded.cfg.arch == MLA_DRAFT_ARCH


def test_norm_before_fc_layout_both_formats(target, tmp_path):
    """input_norm.weight is one [k * H_t] vector beside fc (speculators and SGLang alike); the
    flag is top-level, where both engines read it."""
    for fmt in ("sglang", "speculators"):
        _, path, loaded = _saved(target, tmp_path, "norm_before_fc", fmt)
        assert "input_norm.weight" in _keys(path)
        assert json.loads((path / "config.json").read_text())["norm_before_fc"] is True
        assert loaded.cfg.norm_before_fc and tuple(loaded.input_norm.weight.shape) == (3 * H,)


def test_norm_before_fc_nested_in_eagle_config_is_read(target, tmp_path):
    """SGLang and vLLM read eagle_config.norm_before_fc before the top-level key."""
    _, path, _ = _saved(target, tmp_path, "norm_before_fc")
    cfg = json.loads((path / "config.json").read_text())
    del cfg["norm_before_fc"]
    cfg["eagle_config"]["norm_before_fc"] = True
    (path / "config.json").write_text(json.dumps(cfg))
    assert load_draft(path, target=target).cfg.norm_before_fc


@pytest.mark.parametrize("k", [2, 4])
def test_other_than_three_slots_round_trip(target, tmp_path, k):
    """fc is k x H_t wide; the config says num_aux_hidden_states, which engines size fc from."""
    _, path, loaded = _saved(target, tmp_path, f"k{k}")
    assert json.loads((path / "config.json").read_text())["num_aux_hidden_states"] == k
    assert loaded.cfg.num_aux == k and loaded.cfg.fc_in == k * H


@pytest.mark.parametrize("variant, key, message", [
    # weights the engine would skip (it builds no input_norm without the flag): refused, named
    ("norm_before_fc", "norm_before_fc", "holds input_norm.* but .* does not set norm_before_fc"),
    ("mla", "kv_lora_rank", "kv_lora_rank is None; expected a positive integer"),
])
def test_config_without_what_its_weights_need_is_refused(target, tmp_path, variant, key, message):
    _, path, _ = _saved(target, tmp_path, variant)
    cfg = json.loads((path / "config.json").read_text())
    del cfg[key]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DraftFormatError, match=message):
        load_draft(path, target=target)


def test_mla_has_no_speculators_format(target, tmp_path):
    with pytest.raises(ValueError, match="no speculators format"):
        save_draft(make_variant(target, VARIANTS["mla"]), tmp_path / "x", fmt="speculators")
    assert not (tmp_path / "x").exists()


def test_yarn_rope_as_deepseek_scales_it(target):
    """Kimi's YaRN (factor 64 over 4096): the fastest rotary pairs keep their frequency, the slowest
    are divided by the factor, the softmax scale grows by (0.1 ln 64 + 1)^2 (mscale_all_dim 1)."""
    from helpers.model.draft import KIMI_YARN, MLAAttention

    cfg = new_draft_config(SimpleNamespace(hidden_size=256, vocab_size=VOCAB), DV, [1, 2, 3],
                           **mla_variant(256))
    attn = MLAAttention(cfg)
    d = cfg.qk_rope_head_dim
    plain = 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2).double() / d)
    assert cfg.rope_scaling == KIMI_YARN
    assert math.isclose(float(attn.inv_freq[0]), float(plain[0]), rel_tol=1e-6)
    assert math.isclose(float(attn.inv_freq[-1]), float(plain[-1]) / 64, rel_tol=1e-5)
    qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    assert math.isclose(attn.scale, qk ** -0.5 * (0.1 * math.log(64) + 1) ** 2, rel_tol=1e-9)


# -- as each engine runs it -------------------------------------------------------------------------


def test_run_as_drops_what_a_release_does_not_build(target):
    """SGLang 0.5.16's llama_eagle3 has no input_norm (0.5.17 has); 0.5.12's kimi_k25_eagle3 has no
    fc_norm or norm_output (0.5.13 has). Inside run_as the forward changes; after it, it is back."""
    ids, fused = None, None
    for name, old, new, flags in (("eagle31", "sglang==0.5.16", "sglang==0.5.17", ("norm_before_fc",)),
                                  ("mla_eagle31", "sglang==0.5.12", "sglang==0.5.13",
                                   ("fc_norm", "norm_output"))):
        draft = make_variant(target, VARIANTS[name])
        ids, fused = _inputs(draft)
        with torch.no_grad():
            base = draft.ttt_forward(ids[:, :-1], fused, 2)[1]
            with run_as(draft, E(new)) as notes_new:
                same = draft.ttt_forward(ids[:, :-1], fused, 2)[1]
            with run_as(draft, E(old)) as notes_old:
                other = draft.ttt_forward(ids[:, :-1], fused, 2)[1]
                assert not any(getattr(draft.cfg, f) for f in flags)
        assert torch.equal(base, same) and not notes_new
        assert (other - base).abs().max() > 1e-3
        assert all(any(f in n for n in notes_old) for f in flags)
        assert all(getattr(draft.cfg, f) for f in flags)


def test_flag_rules_by_release():
    """The first releases read honouring each flag (docs/conventions.md, "Forward flags")."""
    llama, mla = "LlamaForCausalLMEagle3", MLA_DRAFT_ARCH
    assert honours_flag(E("sglang==0.5.16"), "norm_before_fc", llama)[0] is False
    assert honours_flag(E("sglang==0.5.17"), "norm_before_fc", llama)[0] is True
    assert honours_flag(E("sglang==0.5.23"), "norm_before_fc", mla)[0] is False       # kimi_k25_eagle3: never
    assert honours_flag(E("vllm==0.33.0"), "norm_before_fc", mla)[0] is False         # deepseek_eagle3: never
    assert honours_flag(E("vllm==0.22.0"), "fc_norm", mla)[0] is False                # built, not applied
    assert honours_flag(E("vllm==0.23.0"), "fc_norm", mla)[0] is True
    spec = "Eagle3Speculator"
    assert honours_flag(E("vllm==0.24.0"), "norm_output", spec, speculators_format=True)[0] is False
    assert honours_flag(E("vllm==0.25.0"), "norm_output", spec, speculators_format=True)[0] is True
    assert honours_flag(E("trtllm"), "norm_output")[0] is None


def _source_rule_holds(root: Path, file: str, flag: str) -> bool:
    text = (root / "sglang" / "srt" / "models" / file)
    return text.is_file() and f'"{flag}"' in text.read_text()


@pytest.mark.parametrize("version", ["0.5.9", "0.5.10", "0.5.12", "0.5.13", "0.5.16", "0.5.17", "0.5.23"])
def test_sglang_rules_agree_with_cached_sources(version):
    """Where a release's source is in the workbook cache, its draft files say what the table says."""
    from helpers.rules.wheels import cached

    root = cached("sglang", version)
    if root is None:
        pytest.skip(f"sglang {version} source not cached")
    for arch, file in (("LlamaForCausalLMEagle3", "llama_eagle3.py"), (MLA_DRAFT_ARCH, "kimi_k25_eagle3.py")):
        for flag in ("norm_before_fc", "fc_norm", "norm_output"):
            if not (root / "sglang" / "srt" / "models" / file).is_file():
                continue
            said = honours_flag(E(f"sglang=={version}"), flag, arch)[0]
            assert said == _source_rule_holds(root, file, flag), (version, file, flag)


def test_check_flags_a_release_that_ignores_a_trained_flag(tmp_path):
    """check, config only: MLA+EAGLE-3.1 on SGLang 0.5.12 (ignores fc_norm and norm_output), on 0.5.9
    (no MLA class at all), and a norm_before_fc draft on 0.5.16; none on the releases that run them."""
    tcfg = tmp_path / "target.json"
    tcfg.write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
                                "num_hidden_layers": 61, "hidden_size": 7168, "vocab_size": 163840}))
    mla = {"architectures": [MLA_DRAFT_ARCH], "hidden_size": 7168, "intermediate_size": 18432,
           "num_attention_heads": 64, "vocab_size": 163840, "model_type": "kimi_k2", "q_lora_rank": 1536,
           "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}, "fc_norm": True,
           "norm_output": True}
    nbf = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 7168, "intermediate_size": 18432,
           "num_attention_heads": 64, "vocab_size": 163840,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58], "norm_before_fc": True}}
    for name, cfg in (("mla", mla), ("nbf", nbf)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))

    def kinds(name, engine):
        return {p.kind for p in check(tmp_path / name, parse_engine(engine), target_config=tcfg).problems}

    assert {"fc-norm", "norm-output"} <= kinds("mla", "sglang==0.5.12")
    assert "draft-class" in kinds("mla", "sglang==0.5.9")
    assert not {"fc-norm", "norm-output", "draft-class"} & kinds("mla", "sglang==0.5.23")
    assert "norm-before-fc" in kinds("nbf", "sglang==0.5.16")
    assert "norm-before-fc" not in kinds("nbf", "sglang==0.5.17")
    assert "norm-before-fc" in kinds("nbf", "vllm==0.17.0") and "norm-before-fc" not in kinds("nbf", "vllm")
    assert ignored_flag_problems(mla, E("trtllm")) == []


# -- scoring paths: dump scoring and diagnose on the workbook's DeepSeek target ---------------------


def _kimi_variant(tmp_path, name, variant, k=2):
    """A random variant as wide as data/tiny-kimi's target, saved beside nothing (its own folder)."""
    tcfg = json.loads((TINY_KIMI / "target" / "config.json").read_text())
    ns = SimpleNamespace(hidden_size=tcfg["hidden_size"], vocab_size=tcfg["vocab_size"])
    torch.manual_seed(0)
    draft = Eagle3Draft(new_draft_config(ns, 256, [2, 6, 10][:k], num_aux=k, **variant))
    with torch.no_grad():
        for p in draft.parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
        draft.d2t.copy_(vocab_maps(torch.arange(256) * 3, tcfg["vocab_size"])[0])
        draft.t2d.copy_(vocab_maps(torch.arange(256) * 3, tcfg["vocab_size"])[1])
    return save_draft(draft, tmp_path / name, with_embedding=True)


VARIANT_SCORED = {"mla_eagle31": {**mla_variant(256), "fc_norm": True, "norm_output": True},
                  "norm_before_fc": {"norm_before_fc": True}}


@pytest.mark.skipif(not (TINY_KIMI / "dump").is_dir(), reason="data/tiny-kimi/dump not present")
@pytest.mark.parametrize("name", sorted(VARIANT_SCORED))
def test_dump_scoring_accepts_variants(tmp_path, name):
    """Every ordered pair of the committed dump's slots scored for a 2-slot variant, by the
    streaming dump scorer, with the engine's forward for the served row."""
    from helpers.investigation.dump_diagnose import diagnose_dump
    from helpers.investigation.dumps import open_dump

    path = _kimi_variant(tmp_path, name, VARIANT_SCORED[name])
    draft = load_draft(path)
    dump = open_dump(TINY_KIMI / "dump")
    d = diagnose_dump(draft, dump, steps=2, max_records=2, max_tokens=96, progress=False)
    assert len(d.ranking) == dump.num_slots * (dump.num_slots - 1)


@pytest.mark.skipif(not (TINY_KIMI / "target" / "model.safetensors").is_file(), reason="no tiny-kimi target")
def test_diagnose_accepts_variants_and_runs_them_as_the_engine_does(tmp_path):
    """diagnose on the workbook's 12-layer DeepSeek target: a 2-slot MLA EAGLE-3.1 draft and a
    2-slot norm_before_fc draft are searched, and the served row is run as the engine runs it."""
    from helpers.investigation.diagnosis import diagnose
    from helpers.investigation.pair import eval_captures, load_pair

    for name, engine, dropped in (("mla_eagle31", "sglang==0.5.12", "fc_norm"),
                                  ("norm_before_fc", "sglang==0.5.16", "norm_before_fc")):
        path = _kimi_variant(tmp_path, name, VARIANT_SCORED[name])
        pair = load_pair(TINY_KIMI / "target", path)
        caps = eval_captures(pair, max_windows=2, window=64)
        d = diagnose(pair, caps, parse_engine(engine), steps=2, progress=False)
        assert len(d.best_layout) == 2 and d.search.evaluations >= 13 * 12
        assert any(dropped in n for n in d.served_notes), d.served_notes


@pytest.mark.parametrize("variant,k", [("eagle31_mla", 3), ("norm_before_fc", 2)])
def test_scale_check_runs_variants(variant, k):
    """scale-check writes the variant in its checkpoint layout and scores it in a fresh process."""
    from helpers.investigation.scale import scale_check

    out = scale_check(hidden=256, vocab=300, intermediate=256, tokens=24, records=1, variant=variant,
                      num_aux=k)
    assert out["variant"] == variant and out["layouts"] == math.perm(max(4, k + 1), k)
    assert out["fc"] == f"{k * 256} -> 256"
