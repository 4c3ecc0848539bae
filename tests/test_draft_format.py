"""The EAGLE-3 draft on disk (SGLang and speculators formats) and its two forward paths.

Formats as DESIGN.md section 3 describes them: SGLang/SpecForge keep ids under
``eagle_config`` and weights under ``midlayer.*``; speculators keeps ids top-level, the layer
config under ``transformer_layer_config`` and weights under ``layers.0.*``. Both store
``fc.weight [H, 3H]``, ``d2t`` (int64 offsets) and ``t2d`` (bool mask), and no embedding.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.draft import (
    SGLANG_ARCH,
    SPECULATORS_ARCH,
    DraftConfig,
    DraftFormatError,
    DraftKVCache,
    Eagle3Draft,
    check_fits_target,
    config_from_json,
    draft_format,
    eagle_ids_of,
    load_draft,
    new_draft_config,
    save_draft,
    vocab_maps,
)

H = 32
VOCAB = 128
DRAFT_VOCAB = 64
IDS = [2, 6, 9]
FORMATS = ("sglang", "speculators")
LAYER_KEYS = {
    "input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
}
TOP_KEYS = {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"}


@pytest.fixture(scope="module")
def target(make_tiny_lm):
    return make_tiny_lm("llama", seed=0, hidden=H, layers=2, vocab=VOCAB)


def _draft_target_ids(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(VOCAB, generator=g)[:DRAFT_VOCAB]


def make_draft(target, seed: int = 0, kv_heads: int | None = None, bf16: bool = True) -> Eagle3Draft:
    """A draft with seeded random weights (norms too), the target's embedding and a random vocab map.

    ``bf16`` rounds every saved weight to bfloat16 so a bf16 checkpoint round-trips exactly.
    """
    cfg = new_draft_config(target.config, DRAFT_VOCAB, IDS)
    if kv_heads is not None:
        cfg.num_key_value_heads = kv_heads
    torch.manual_seed(seed)
    draft = Eagle3Draft(cfg)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
        draft.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
        if bf16:
            for name, p in draft.named_parameters():
                if not name.startswith("embed_tokens."):
                    p.copy_(p.bfloat16().float())
        d2t, t2d = vocab_maps(_draft_target_ids(seed), VOCAB)
        draft.d2t.copy_(d2t)
        draft.t2d.copy_(t2d)
    return draft.eval()


def _inputs(seed: int = 5, t: int = 10, batch: int = 1, width: int = 3 * H):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, t), generator=g)
    fused = torch.randn(batch, t, width, generator=g)
    return ids, fused


def _snapshot(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())} if path.is_dir() else {}


@pytest.fixture
def saved(target, tmp_path):
    """(draft, dir) per format: the draft written to disk in bf16."""
    def _save(fmt: str, **kw):
        draft = make_draft(target, **kw)
        return draft, save_draft(draft, tmp_path / fmt, fmt=fmt)
    return _save


# -- config.json and weights on disk ------------------------------------------------------------


def test_sglang_config_json(saved):
    _, path = saved("sglang")
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == [SGLANG_ARCH] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == IDS
    assert "eagle_aux_hidden_state_layer_ids" not in cfg          # SGLang reads only the nested key
    assert cfg["draft_vocab_size"] == DRAFT_VOCAB
    assert cfg["target_hidden_size"] == H
    assert cfg["hidden_size"] == H and cfg["vocab_size"] == VOCAB
    assert cfg["num_hidden_layers"] == 1
    assert eagle_ids_of(cfg) == (IDS, "eagle_config")


def test_speculators_config_json(saved):
    _, path = saved("speculators")
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == [SPECULATORS_ARCH] == ["Eagle3Speculator"]
    assert cfg["speculators_model_type"] == "eagle3"
    assert cfg["eagle_aux_hidden_state_layer_ids"] == IDS
    assert "eagle_config" not in cfg
    layer = cfg["transformer_layer_config"]
    assert layer["hidden_size"] == H and layer["vocab_size"] == VOCAB
    assert layer["num_attention_heads"] == 4 and layer["head_dim"] == H // 4
    assert cfg["draft_vocab_size"] == DRAFT_VOCAB and cfg["target_hidden_size"] == H
    assert eagle_ids_of(cfg) == (IDS, "top_level")


@pytest.mark.parametrize("fmt, prefix, other", [("sglang", "midlayer.", "layers.0."),
                                                ("speculators", "layers.0.", "midlayer.")])
def test_weights_on_disk(saved, fmt, prefix, other):
    draft, path = saved(fmt)
    w = load_file(str(path / "model.safetensors"))
    assert set(w) == TOP_KEYS | {prefix + k for k in LAYER_KEYS}
    assert not any(k.startswith(other) for k in w)
    assert not any(k.startswith("embed_tokens") for k in w)      # the embedding stays with the target
    assert w["fc.weight"].shape == (H, 3 * H)
    assert w["fc.weight"].dtype == torch.bfloat16
    assert w[prefix + "self_attn.q_proj.weight"].shape == (H, 2 * H)   # attention reads cat(embed, hidden)
    assert w["lm_head.weight"].shape == (DRAFT_VOCAB, H)
    assert w["d2t"].dtype == torch.int64 and w["d2t"].shape == (DRAFT_VOCAB,)
    assert w["t2d"].dtype == torch.bool and w["t2d"].shape == (VOCAB,)
    assert torch.equal(w["d2t"], draft.d2t) and torch.equal(w["t2d"], draft.t2d)
    # The layer weights are the draft's own, under the format's prefix.
    torch.testing.assert_close(w[prefix + "hidden_norm.weight"].float(), draft.midlayer.hidden_norm.weight.data)
    torch.testing.assert_close(w[prefix + "input_layernorm.weight"].float(),
                               draft.midlayer.input_layernorm.weight.data)


def test_save_float32(target, tmp_path):
    draft = make_draft(target, bf16=False)
    path = save_draft(draft, tmp_path / "f32", dtype=torch.float32)
    w = load_file(str(path / "model.safetensors"))
    assert w["fc.weight"].dtype == torch.float32
    loaded = load_draft(path, target=target)
    for k, v in draft.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_save_without_ids(target, tmp_path):
    draft = make_draft(target)
    draft.cfg.eagle_ids = None
    for fmt in FORMATS:
        cfg = json.loads((save_draft(draft, tmp_path / fmt, fmt=fmt) / "config.json").read_text())
        assert eagle_ids_of(cfg) == (None, "none")
        assert "eagle_config" not in cfg and "eagle_aux_hidden_state_layer_ids" not in cfg
        assert load_draft(tmp_path / fmt, target=target).cfg.ids_location == "none"


def test_unknown_format_is_rejected(target, tmp_path):
    with pytest.raises(ValueError, match="unknown draft format"):
        save_draft(make_draft(target), tmp_path / "x", fmt="eagle")


# -- load back ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip(saved, target, fmt):
    draft, path = saved(fmt)
    loaded = load_draft(path, target=target)
    assert loaded.cfg.format == fmt
    assert loaded.cfg.eagle_ids == IDS
    assert loaded.cfg.ids_location == ("eagle_config" if fmt == "sglang" else "top_level")
    for field in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                  "vocab_size", "draft_vocab_size", "target_hidden_size", "num_aux", "rms_norm_eps", "rope_theta"):
        assert getattr(loaded.cfg, field) == getattr(draft.cfg, field), field
    assert not loaded.training
    a, b = draft.state_dict(), loaded.state_dict()
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert torch.equal(a[k], b[k]), k
    # Borrowed embedding is a copy, not the target's own storage.
    assert loaded.embed_tokens.weight.data_ptr() != target.get_input_embeddings().weight.data_ptr()
    assert torch.equal(loaded.draft_token_ids, torch.sort(_draft_target_ids()).values)

    ids, fused = _inputs()
    with torch.no_grad():
        want = draft.ttt_forward(ids, fused, steps=3)
        got = loaded.ttt_forward(ids, fused, steps=3)
    assert len(got) == 3
    for j, (w, g) in enumerate(zip(want, got)):
        assert g.shape == (1, ids.shape[1], DRAFT_VOCAB)
        torch.testing.assert_close(g, w, atol=1e-6, rtol=0, msg=f"step {j}")


def test_round_trip_close_to_unrounded_original(target, tmp_path):
    """bf16 on disk loses only rounding: logits stay close to the float32 draft's."""
    draft = make_draft(target, bf16=False)
    loaded = load_draft(save_draft(draft, tmp_path / "d"), target=target)
    ids, fused = _inputs()
    with torch.no_grad():
        want = draft.ttt_forward(ids, fused, steps=2)
        got = loaded.ttt_forward(ids, fused, steps=2)
    for w, g in zip(want, got):
        assert (g - w).abs().max() < 0.05 * w.abs().max()


def test_convert_between_formats(saved, target, tmp_path):
    _, path = saved("speculators")
    loaded = load_draft(path, target=target)
    out = save_draft(loaded, tmp_path / "as_sglang", fmt="sglang")
    a = load_file(str(path / "model.safetensors"))
    b = load_file(str(out / "model.safetensors"))
    renamed = {("midlayer." + k[len("layers.0."):]) if k.startswith("layers.0.") else k: v for k, v in a.items()}
    assert set(renamed) == set(b)
    for k in b:
        assert torch.equal(renamed[k], b[k]), k
    cfg = json.loads((out / "config.json").read_text())
    assert eagle_ids_of(cfg) == (IDS, "eagle_config")


def test_load_without_target_needs_an_embedding(saved):
    _, path = saved("sglang")
    with pytest.raises(DraftFormatError, match="pass the target"):
        load_draft(path)


# -- TTT unroll == cached chain ------------------------------------------------------------------


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_ttt_unroll_equals_cached_chain(target, kv_heads):
    """ttt_forward's step j at column c is what the engine computes: extend columns 0..c
    with the target's features, then j chain steps feeding back the pre-norm state at
    positions c+1..c+j, with the chain entries cropped away before the next column."""
    draft = make_draft(target, seed=1, kv_heads=kv_heads, bf16=False)
    steps, t = 3, 10
    ids, fused = _inputs(seed=7, t=t)
    with torch.no_grad():
        ttt = draft.ttt_forward(ids, fused, steps=steps)
        cache = DraftKVCache(draft.cfg, 1, 64)
        checked = 0
        for c in range(t - 1):
            # Column c is fed token c+1 and the target's feature at c (as DraftRunner.extend).
            logits, state = draft.step(ids[:, c + 1:c + 2], fused[:, c:c + 1], torch.tensor([[c]]), cache)
            torch.testing.assert_close(logits[:, 0], ttt[0][:, c], atol=1e-4, rtol=0, msg=f"step 0 col {c}")
            checked += 1
            for j in range(1, steps):
                if c + 1 + j >= t:
                    break
                logits, state = draft.step(ids[:, c + 1 + j:c + 2 + j], state, torch.tensor([[c + j]]), cache)
                torch.testing.assert_close(logits[:, 0], ttt[j][:, c], atol=1e-4, rtol=0,
                                           msg=f"step {j} col {c}")
                checked += 1
            assert cache.length == c + 1 + min(steps - 1, t - 2 - c)
            cache.crop(c + 1)                 # drop the chain entries, keep the verified columns
            assert cache.length == c + 1
    assert checked == sum(min(steps, t - 1 - c) for c in range(t - 1))


def test_ttt_column_equals_one_multi_column_extend(target):
    """Extending columns 0..c in one call gives the same step-0 state as column by column."""
    draft = make_draft(target, seed=2, bf16=False)
    ids, fused = _inputs(seed=8, t=8)
    c = 5
    with torch.no_grad():
        ttt = draft.ttt_forward(ids, fused, steps=2)
        cache = DraftKVCache(draft.cfg, 1, 32)
        logits, state = draft.step(ids[:, 1:c + 2], fused[:, :c + 1], torch.arange(c + 1)[None], cache)
        torch.testing.assert_close(logits[0], ttt[0][0, :c + 1], atol=1e-4, rtol=0)
        logits, _ = draft.step(ids[:, c + 2:c + 3], state[:, -1:], torch.tensor([[c + 1]]), cache)
        torch.testing.assert_close(logits[:, 0], ttt[1][:, c], atol=1e-4, rtol=0)


def test_ttt_batch_rows_are_independent(target):
    draft = make_draft(target, seed=3, bf16=False)
    ids, fused = _inputs(seed=9, t=6, batch=2)
    with torch.no_grad():
        both = draft.ttt_forward(ids, fused, steps=2)
        for r in range(2):
            one = draft.ttt_forward(ids[r:r + 1], fused[r:r + 1], steps=2)
            for j in range(2):
                torch.testing.assert_close(both[j][r:r + 1], one[j], atol=1e-5, rtol=0)


def test_project_rejects_wrong_width(target):
    draft = make_draft(target)
    with pytest.raises(DraftFormatError, match=f"expects {3 * H}"):
        draft.project(torch.zeros(1, 2, 2 * H))
    assert draft.project(torch.ones(1, 2, H)).equal(torch.ones(1, 2, H))   # its own state skips fc


# -- vocabulary map ---------------------------------------------------------------------------------


def test_vocab_maps():
    tids = torch.tensor([7, 3, 100, 0])
    d2t, t2d = vocab_maps(tids, VOCAB)
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert (torch.arange(4) + d2t).tolist() == [0, 3, 7, 100]        # target_id = draft_id + d2t[draft_id]
    assert t2d.shape == (VOCAB,) and t2d.sum() == 4
    assert t2d[[0, 3, 7, 100]].all()


@pytest.mark.parametrize("bad", [[0, VOCAB], [-1, 5]])
def test_vocab_maps_outside_vocab(bad):
    with pytest.raises(DraftFormatError):
        vocab_maps(torch.tensor(bad), VOCAB)


# -- bad input: clear errors, nothing changed ----------------------------------------------------


def _expect_untouched(path: Path, target, fn, exc, match):
    files = _snapshot(path)
    emb = target.get_input_embeddings().weight.detach().clone()
    with pytest.raises(exc, match=match):
        fn()
    assert _snapshot(path) == files
    assert torch.equal(target.get_input_embeddings().weight, emb)


def _edit_weights(path: Path, edit):
    w = load_file(str(path / "model.safetensors"))
    edit(w)
    save_file(w, str(path / "model.safetensors"), metadata={"format": "pt"})


def _edit_config(path: Path, edit):
    cfg = json.loads((path / "config.json").read_text())
    edit(cfg)
    (path / "config.json").write_text(json.dumps(cfg))


def test_missing_dir(target, tmp_path):
    missing = tmp_path / "nowhere"
    _expect_untouched(missing, target, lambda: load_draft(missing, target=target), FileNotFoundError, "no draft at")
    assert not missing.exists()


@pytest.mark.parametrize("fmt", FORMATS)
def test_missing_config(saved, target, fmt):
    _, path = saved(fmt)
    (path / "config.json").unlink()
    _expect_untouched(path, target, lambda: load_draft(path, target=target), FileNotFoundError, "config.json")


@pytest.mark.parametrize("fmt", FORMATS)
def test_missing_weights(saved, target, fmt):
    _, path = saved(fmt)
    (path / "model.safetensors").unlink()
    _expect_untouched(path, target, lambda: load_draft(path, target=target), FileNotFoundError, "no weights")


@pytest.mark.parametrize("fmt", FORMATS)
def test_fc_width_not_a_multiple(saved, target, fmt):
    _, path = saved(fmt)
    _edit_weights(path, lambda w: w.update({"fc.weight": torch.zeros(H, 3 * H + 1, dtype=torch.bfloat16)}))
    _expect_untouched(path, target, lambda: load_draft(path, target=target), DraftFormatError,
                      rf"input width {3 * H + 1} is not a multiple of the target hidden size {H}")


def test_missing_fc(saved, target):
    _, path = saved("sglang")
    _edit_weights(path, lambda w: w.pop("fc.weight"))
    _expect_untouched(path, target, lambda: load_draft(path, target=target), DraftFormatError, "no fc.weight")


def test_unexpected_weight(saved, target):
    _, path = saved("sglang")
    _edit_weights(path, lambda w: w.update({"midlayer.extra.weight": torch.zeros(2)}))
    _expect_untouched(path, target, lambda: load_draft(path, target=target), DraftFormatError, "unexpected")


@pytest.mark.parametrize("fmt", FORMATS)
def test_target_hidden_mismatch(saved, target, make_tiny_lm, fmt):
    _, path = saved(fmt)
    wide = make_tiny_lm("llama", hidden=48, layers=2, vocab=VOCAB)
    _expect_untouched(path, wide, lambda: load_draft(path, target=wide), DraftFormatError,
                      "expects target hidden size 32; the target has 48")


def test_target_hidden_mismatch_in_config(saved, target):
    """A config claiming a 16-wide target (fc 96 = 6 x 16) does not fit a 32-wide one."""
    _, path = saved("sglang")
    _edit_config(path, lambda c: c.update({"target_hidden_size": 16}))
    _expect_untouched(path, target, lambda: load_draft(path, target=target), DraftFormatError,
                      "expects target hidden size 16")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shift", [VOCAB, -1])
def test_vocab_map_outside_target_vocab(saved, target, fmt, shift):
    _, path = saved(fmt)

    def edit(w):
        d2t = w["d2t"].clone()
        i = DRAFT_VOCAB - 1 if shift > 0 else 0
        d2t[i] = shift - i                 # draft id i -> target id VOCAB (or -1)
        w["d2t"] = d2t
    _edit_weights(path, edit)
    _expect_untouched(path, target, lambda: load_draft(path, target=target), DraftFormatError,
                      f"outside the target vocabulary 0..{VOCAB - 1}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_target_vocab_mismatch(saved, make_tiny_lm, fmt):
    _, path = saved(fmt)
    other = make_tiny_lm("llama", hidden=H, layers=2, vocab=VOCAB + 32)
    _expect_untouched(path, other, lambda: load_draft(path, target=other), DraftFormatError,
                      f"draft vocab_size is {VOCAB}; the target's vocabulary has {VOCAB + 32}")


def test_non_eagle_architecture(saved, target):
    _, path = saved("sglang")
    _edit_config(path, lambda c: (c.update({"architectures": ["LlamaForCausalLM"]}), c.pop("eagle_config")))
    _expect_untouched(path, target, lambda: load_draft(path, target=target), DraftFormatError,
                      "not an EAGLE-3 draft")


def test_draft_format_detection():
    assert draft_format({"architectures": [SGLANG_ARCH]}) == "sglang"
    assert draft_format({"architectures": [SPECULATORS_ARCH]}) == "speculators"
    assert draft_format({"architectures": ["Whatever"], "speculators_model_type": "eagle3"}) == "speculators"
    assert draft_format({"architectures": ["LlamaForCausalLM"], "eagle_config": {}}) == "sglang"
    for bad in ({"architectures": ["LlamaForCausalLM"]}, {}, {"architectures": ["Qwen2ForCausalLM"]}):
        with pytest.raises(DraftFormatError, match="not an EAGLE-3 draft"):
            draft_format(bad)


def test_check_fits_target_embedding_width(target):
    cfg = DraftConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4,
                      head_dim=16, vocab_size=VOCAB, draft_vocab_size=DRAFT_VOCAB, target_hidden_size=H)
    with pytest.raises(DraftFormatError, match="cannot share"):
        check_fits_target(cfg, target)
    check_fits_target(new_draft_config(target.config, DRAFT_VOCAB, IDS), target)   # fits: no error


# -- where the ids live ---------------------------------------------------------------------------


@pytest.mark.parametrize("cfg, expected", [
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 5, 8]}}, ([1, 5, 8], "eagle_config")),
    ({"eagle_aux_hidden_state_layer_ids": [2, 6, 9]}, ([2, 6, 9], "top_level")),
    ({}, (None, "none")),
    ({"eagle_config": None}, (None, "none")),
    ({"eagle_config": {"use_aux_hidden_state": True}, "eagle_aux_hidden_state_layer_ids": [0, 3]},
     ([0, 3], "top_level")),
    # Both present: the nested key wins (it is what SGLang reads).
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 2, 6]}, "eagle_aux_hidden_state_layer_ids": [0, 3, 7]},
     ([-1, 2, 6], "eagle_config")),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": ["2", 6.0]}}, ([2, 6], "eagle_config")),
])
def test_eagle_ids_of(cfg, expected):
    assert eagle_ids_of(cfg) == expected


def test_config_from_json_speculators_reads_layer_config():
    cfg = config_from_json({
        "architectures": [SPECULATORS_ARCH], "draft_vocab_size": 50, "target_hidden_size": 24,
        "eagle_aux_hidden_state_layer_ids": [0, 3, 7],
        "transformer_layer_config": {"hidden_size": 48, "intermediate_size": 96, "num_attention_heads": 6,
                                     "num_key_value_heads": 2, "vocab_size": 300, "rms_norm_eps": 1e-5,
                                     "rope_theta": 5e5},
    })
    assert (cfg.format, cfg.hidden_size, cfg.head_dim, cfg.num_key_value_heads) == ("speculators", 48, 8, 2)
    assert (cfg.vocab_size, cfg.draft_vocab_size, cfg.target_hidden_size) == (300, 50, 24)
    assert (cfg.rms_norm_eps, cfg.rope_theta) == (1e-5, 5e5)
    assert (cfg.eagle_ids, cfg.ids_location) == ([0, 3, 7], "top_level")


# -- defects found and fixed in the helpers (kept as regressions) -------------------------------


def test_vocab_maps_error_names_the_negative_id():
    with pytest.raises(DraftFormatError, match="target id -1"):
        vocab_maps(torch.tensor([-1, 5]), VOCAB)


def test_check_vocab_map_error_names_the_negative_id(saved, target):
    _, path = saved("sglang")

    def edit(w):
        d2t = w["d2t"].clone()
        d2t[0] = -1
        w["d2t"] = d2t
    _edit_weights(path, edit)
    with pytest.raises(DraftFormatError, match="target id -1"):
        load_draft(path, target=target)


def test_weight_shape_mismatch_is_a_format_error(saved, target):
    _, path = saved("sglang")
    _edit_weights(path, lambda w: w.update({"lm_head.weight": w["lm_head.weight"][:60].clone()}))
    with pytest.raises(DraftFormatError):
        load_draft(path, target=target)
