"""The EAGLE-3 draft on disk (SGLang and speculators formats) and its two forward paths.

Formats as docs/conventions.md describes them: SGLang/SpecForge keep ids under
``eagle_config`` and weights under ``midlayer.*``; speculators keeps ids top-level, the layer
config under ``transformer_layer_config`` and weights under ``layers.0.*``. Both store
``fc.weight [H, 3H]``, ``d2t`` (int64 offsets) and ``t2d`` (bool mask), and no embedding.

Drafts written by other tools also arrive as ``pytorch_model.bin`` (EAGLE reference) or sharded
safetensors, with only ``d2t``, with their own embedding (a draft wider than its target), or
with speculators' ``norm_before_residual``, which changes the forward without changing a shape.
"""
from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.model.checkpoint import (
    check_fits_target,
    config_from_json,
    config_to_json,
    draft_format,
    load_draft,
    save_draft,
)
from helpers.model.draft import (
    SGLANG_ARCH,
    DraftConfig,
    DraftFormatError,
    DraftKVCache,
    Eagle3Draft,
    ServingMismatchWarning,
    new_draft_config,
    vocab_maps,
)
from helpers.rules.conventions import SPECULATORS_ARCH, DraftConfigError, ids_in_config, parse_engine

H = 32
VOCAB = 128
DRAFT_VOCAB = 64
IDS = [2, 6, 9]
FORMATS = ("sglang", "speculators")
LAYER_KEYS = {
    "input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
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
    assert ids_in_config(cfg) == (IDS, "eagle_config")


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
    assert ids_in_config(cfg) == (IDS, "top-level")


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
    torch.testing.assert_close(w[prefix + "hidden_norm.weight"].float(),
                               draft.midlayer.hidden_norm.weight.data)
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
        assert ids_in_config(cfg) == (None, "none")
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
    assert loaded.cfg.ids_location == ("eagle_config" if fmt == "sglang" else "top-level")
    for field in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                  "head_dim", "vocab_size", "draft_vocab_size", "target_hidden_size", "num_aux",
                  "rms_norm_eps", "rope_theta"):
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
    renamed = {("midlayer." + k[len("layers.0."):]) if k.startswith("layers.0.") else k: v
               for k, v in a.items()}
    assert set(renamed) == set(b)
    for k in b:
        assert torch.equal(renamed[k], b[k]), k
    cfg = json.loads((out / "config.json").read_text())
    assert ids_in_config(cfg) == (IDS, "eagle_config")


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
    _expect_untouched(missing, target, lambda: load_draft(missing, target=target), DraftConfigError,
                      "not found")
    assert not missing.exists()


@pytest.mark.parametrize("fmt", FORMATS)
def test_missing_config(saved, target, fmt):
    _, path = saved(fmt)
    (path / "config.json").unlink()
    _expect_untouched(path, target, lambda: load_draft(path, target=target), DraftConfigError, "config.json")


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
    _edit_config(path, lambda c: (c.update({"architectures": ["LlamaForCausalLM"]}), c.pop("eagle_config"),
                                  c.pop("draft_vocab_size")))
    _expect_untouched(path, target, lambda: load_draft(path, target=target), DraftConfigError,
                      "not an EAGLE-3 draft")


def test_eagle_reference_head_loads(saved, target):
    """The EAGLE reference code's own head (its traineagle3/config.json): a plain one-layer
    LlamaForCausalLM config with draft_vocab_size and SGLang's weight names. It runs as the same
    draft as the SGLang-format copy of it."""
    draft, path = saved("sglang")
    _edit_config(path, lambda c: (c.update({"architectures": ["LlamaForCausalLM"]}), c.pop("eagle_config")))
    loaded = load_draft(path, target=target)
    assert loaded.cfg.format == "sglang" and loaded.cfg.arch == "LlamaForCausalLM"
    assert loaded.cfg.eagle_ids is None
    a, b = draft.state_dict(), loaded.state_dict()
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    ids, fused = _inputs()
    with torch.no_grad():
        for w, g in zip(draft.ttt_forward(ids, fused, steps=2), loaded.ttt_forward(ids, fused, steps=2)):
            torch.testing.assert_close(g, w, atol=1e-6, rtol=0)


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
    ({"eagle_aux_hidden_state_layer_ids": [2, 6, 9]}, ([2, 6, 9], "top-level")),
    ({}, (None, "none")),
    ({"eagle_config": None}, (None, "none")),
    ({"eagle_config": {"use_aux_hidden_state": True}, "eagle_aux_hidden_state_layer_ids": [0, 3]},
     ([0, 3], "top-level")),
    # Both present: the nested key wins (it is what SGLang reads).
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 2, 6]},
      "eagle_aux_hidden_state_layer_ids": [0, 3, 7]},
     ([-1, 2, 6], "eagle_config")),
])
def test_ids_in_config(cfg, expected):
    assert ids_in_config(cfg) == expected


def test_ids_that_are_not_integers_are_refused():
    with pytest.raises(DraftConfigError, match="expected a list of integer layer ids"):
        ids_in_config({"eagle_config": {"eagle_aux_hidden_state_layer_ids": ["2", 6.0]}})


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
    assert (cfg.eagle_ids, cfg.ids_location) == ([0, 3, 7], "top-level")


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


# -- norm_before_residual (speculators / vLLM) ------------------------------------------------------


def _rms(x, w, eps):
    return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def _rotate(x, pos, theta):
    """Llama RoPE on one row [heads, D]: dims i and i + D/2 turn together by pos * theta^(-2i/D)."""
    d = x.shape[-1]
    half = d // 2
    ang = pos * torch.tensor([theta ** (-2.0 * i / d) for i in range(half)], dtype=torch.float64)
    c, s = ang.cos(), ang.sin()
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * c - b * s, b * c + a * s], -1)


def _reference_logits(draft, rows, norm_before_residual: bool) -> torch.Tensor:
    """The EAGLE-3 layer written out row by row in float64, independently of helpers.model.draft.

    ``rows`` is a list of (token id, position, source); source is a fused target feature
    (goes through fc) or the index of an earlier row whose pre-norm output is fed back (a
    chain step). Each row attends to every earlier row and itself. With the flag, the
    attention output is added to hidden_norm(h) instead of h (speculators
    ``Eagle3FirstLayerMixin.forward``, vLLM ``_norm_before_residual``).
    """
    c = draft.cfg
    w = {k: v.double() for k, v in draft.state_dict().items()}
    m = "midlayer."
    eps, hd, nh, nkv = c.rms_norm_eps, c.head_dim, c.num_attention_heads, c.num_key_value_heads
    outs, logits, keys, vals = [], [], [], []
    for tok, pos, src in rows:
        h = outs[src] if isinstance(src, int) else w["fc.weight"] @ src.double()
        e = w["embed_tokens.weight"][tok]
        hn = _rms(h, w[m + "hidden_norm.weight"], eps)
        x = torch.cat([_rms(e, w[m + "input_layernorm.weight"], eps), hn])
        q = _rotate((w[m + "self_attn.q_proj.weight"] @ x).view(nh, hd), pos, c.rope_theta)
        keys.append(_rotate((w[m + "self_attn.k_proj.weight"] @ x).view(nkv, hd), pos, c.rope_theta))
        vals.append((w[m + "self_attn.v_proj.weight"] @ x).view(nkv, hd))
        heads = []
        for i in range(nh):
            g = i // (nh // nkv)                       # query head i reads kv head g
            scores = torch.stack([k[g] @ q[i] for k in keys]) / math.sqrt(hd)
            p = scores.softmax(0)
            heads.append(sum(pj * v[g] for pj, v in zip(p, vals)))
        attn = w[m + "self_attn.o_proj.weight"] @ torch.cat(heads)
        resid = (hn if norm_before_residual else h) + attn
        u = _rms(resid, w[m + "post_attention_layernorm.weight"], eps)
        gate = w[m + "mlp.gate_proj.weight"] @ u
        out = resid + w[m + "mlp.down_proj.weight"] @ (gate * torch.sigmoid(gate)
                                                       * (w[m + "mlp.up_proj.weight"] @ u))
        outs.append(out)
        logits.append(w["lm_head.weight"] @ _rms(out, w["norm.weight"], eps))
    return torch.stack(logits)


def _flagged(target, tmp_path, fmt="speculators", seed=4):
    """A GQA draft saved with norm_before_residual=true and loaded back (float32 on disk)."""
    draft = make_draft(target, seed=seed, kv_heads=2, bf16=False)
    draft.cfg.norm_before_residual = True
    path = save_draft(draft, tmp_path / f"flagged_{fmt}", fmt=fmt, dtype=torch.float32)
    with pytest.warns(ServingMismatchWarning, match="SGLang"):
        loaded = load_draft(path, target=target)
    return loaded, path


def _engine_logits(draft, ids, fused, c):
    """Columns 0..c extended with the target's features, then one chain step at column c."""
    with torch.no_grad():
        cache = DraftKVCache(draft.cfg, 1, 32)
        ext, state = draft.step(ids[:, 1:c + 2], fused[:, :c + 1], torch.arange(c + 1)[None], cache)
        chain, _ = draft.step(ids[:, c + 2:c + 3], state[:, -1:], torch.tensor([[c + 1]]), cache)
        ttt = draft.ttt_forward(ids, fused, steps=2)
    return torch.cat([ext[0], chain[0]]), torch.cat([ttt[0][0, :c + 1], ttt[1][0, c:c + 1]])


@pytest.mark.parametrize("flag", [True, False])
def test_norm_before_residual_matches_reference(target, tmp_path, flag):
    """Cached path and TTT unroll both equal the hand-written layer, with the flag and without."""
    loaded, _ = _flagged(target, tmp_path)
    loaded.cfg.norm_before_residual = flag
    ids, fused = _inputs(seed=11, t=8)
    c = 5
    rows = [(int(ids[0, r + 1]), r, fused[0, r]) for r in range(c + 1)] + [(int(ids[0, c + 2]), c + 1, c)]
    want = _reference_logits(loaded, rows, norm_before_residual=flag).float()
    cached, ttt = _engine_logits(loaded, ids, fused, c)
    torch.testing.assert_close(cached, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ttt, want, atol=1e-4, rtol=1e-4)


def test_norm_before_residual_changes_logits(target, tmp_path):
    """Same weights, flag on vs off: the logits differ well beyond rounding, at every step."""
    loaded, _ = _flagged(target, tmp_path)
    assert loaded.cfg.norm_before_residual
    ids, fused = _inputs(seed=12, t=8)
    flagged = _engine_logits(loaded, ids, fused, 5)[0]
    loaded.cfg.norm_before_residual = False          # what SGLang runs
    plain = _engine_logits(loaded, ids, fused, 5)[0]
    gap = (flagged - plain).abs().amax(-1)
    assert (gap > 1e-2).all(), gap
    # The unflagged draft is the one saved without the flag: the toggle is the whole difference.
    same = make_draft(target, seed=4, kv_heads=2, bf16=False)
    torch.testing.assert_close(_engine_logits(same, ids, fused, 5)[0], plain, atol=1e-5, rtol=0)


@pytest.mark.parametrize("fmt", FORMATS)
def test_norm_before_residual_round_trip(target, tmp_path, fmt):
    loaded, path = _flagged(target, tmp_path, fmt=fmt)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["norm_before_residual"] is True        # top-level, where speculators and vLLM read it
    assert loaded.cfg.norm_before_residual and loaded.cfg.format == fmt


def test_norm_before_residual_off_is_written_as_before(saved):
    _, path = saved("speculators")
    assert json.loads((path / "config.json").read_text())["norm_before_residual"] is False
    _, path = saved("sglang")
    assert "norm_before_residual" not in json.loads((path / "config.json").read_text())


def test_sglang_config_with_flag_warns(saved, target):
    """SGLang's llama_eagle3.py never reads the flag: loading such a draft says so."""
    _, path = saved("sglang")
    _edit_config(path, lambda c: c.update({"norm_before_residual": True}))
    with pytest.warns(ServingMismatchWarning, match=r"SGLang.*ignores the flag"):
        loaded = load_draft(path, target=target)
    assert loaded.cfg.norm_before_residual


def test_unflagged_load_does_not_warn(saved, target):
    _, path = saved("speculators")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ServingMismatchWarning)
        assert not load_draft(path, target=target).cfg.norm_before_residual


def test_flag_in_layer_config_is_read():
    cfg = config_from_json({"architectures": [SPECULATORS_ARCH], "draft_vocab_size": 50,
                            "transformer_layer_config": {"hidden_size": 32, "intermediate_size": 64,
                                                         "num_attention_heads": 4, "vocab_size": 100,
                                                         "norm_before_residual": True}})
    assert cfg.norm_before_residual


@pytest.mark.parametrize("flag,weights", [("norm_before_fc", "input_norm"), ("fc_norm", "fc_norm")])
def test_norm_flag_without_its_weights_is_refused(saved, target, flag, weights):
    """An engine builds the norm from the flag and would serve it untrained (ones): refused, named."""
    _, path = saved("speculators")
    _edit_config(path, lambda c: c.update({flag: True}))
    _expect_untouched(path, target, lambda: load_draft(path, target=target), DraftFormatError,
                      f"lacks {weights}.* but .*config.json sets {flag}")


def test_norm_output_loads_and_is_honoured(saved, target):
    """norm_output adds no weight: it changes what the next step is fed (tests/test_draft_variants.py
    checks the forward)."""
    _, path = saved("speculators")
    _edit_config(path, lambda c: c.update({"norm_output": True}))
    assert load_draft(path, target=target).cfg.norm_output


def test_non_boolean_flag_is_refused(saved, target):
    _, path = saved("speculators")
    _edit_config(path, lambda c: c.update({"norm_before_residual": "false"}))
    _expect_untouched(path, target, lambda: load_draft(path, target=target), DraftFormatError,
                      "norm_before_residual is 'false'; expected true or false")


# -- vocabulary buffers as other tools ship them ----------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_d2t_without_t2d_derives_t2d(saved, target, fmt):
    draft, path = saved(fmt)
    _edit_weights(path, lambda w: w.pop("t2d"))
    loaded = load_draft(path, target=target)
    assert loaded.t2d.dtype == torch.bool
    assert torch.equal(loaded.t2d, draft.t2d)
    assert torch.equal(loaded.d2t, draft.d2t)


@pytest.mark.parametrize("drop", [("d2t", "t2d"), ("d2t",)])
def test_no_d2t_with_reduced_vocab_is_refused(saved, target, drop):
    _, path = saved("sglang")
    _edit_weights(path, lambda w: [w.pop(k) for k in drop])
    has = "t2d but no d2t" if drop == ("d2t",) else "no d2t"
    _expect_untouched(path, target, lambda: load_draft(path, target=target), DraftFormatError,
                      f"has {has}, but draft_vocab_size {DRAFT_VOCAB} differs from the target vocab_size "
                      f"{VOCAB}")


def test_no_d2t_with_full_vocab_is_identity(target, tmp_path):
    draft = Eagle3Draft(new_draft_config(target.config, VOCAB, IDS))
    path = save_draft(draft, tmp_path / "full")
    _edit_weights(path, lambda w: (w.pop("d2t"), w.pop("t2d")))
    loaded = load_draft(path, target=target)
    assert torch.equal(loaded.draft_token_ids, torch.arange(VOCAB))
    assert loaded.t2d.all() and loaded.t2d.shape == (VOCAB,)


def test_t2d_disagreeing_with_d2t_is_refused(saved, target):
    draft, path = saved("sglang")
    i = int((~draft.t2d).nonzero()[0])

    def edit(w):
        t2d = w["t2d"].clone()
        t2d[i] = True
        w["t2d"] = t2d
    _edit_weights(path, edit)
    _expect_untouched(path, target, lambda: load_draft(path, target=target), DraftFormatError,
                      rf"t2d and d2t disagree: t2d marks {DRAFT_VOCAB + 1} target ids, d2t maps to "
                      rf"{DRAFT_VOCAB}; first difference at target id {i}")


def test_t2d_wrong_length_is_refused(saved, target):
    _, path = saved("sglang")
    _edit_weights(path, lambda w: w.update({"t2d": w["t2d"][:-1].clone()}))
    _expect_untouched(path, target, lambda: load_draft(path, target=target), DraftFormatError,
                      rf"t2d has shape \({VOCAB - 1},\); expected \({VOCAB},\)")


def test_float_d2t_is_refused(saved, target):
    _, path = saved("sglang")
    _edit_weights(path, lambda w: w.update({"d2t": w["d2t"].float()}))
    _expect_untouched(path, target, lambda: load_draft(path, target=target), DraftFormatError,
                      "d2t is torch.float32")


# -- weight files and key names other tools write -----------------------------------------------------


def _eagle_reference_dir(draft, path: Path, embed: bool = True, rename=None) -> Path:
    """An EAGLE reference (SafeAILab) style draft: SGLang config, ``pytorch_model.bin`` with
    ``midlayer.*``, ``fc.weight``, ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d`` and
    usually ``embed_tokens.weight``; no safetensors."""
    path.mkdir(parents=True)
    sd = {k: v.clone() for k, v in draft.state_dict().items() if embed or not k.startswith("embed_tokens.")}
    if rename:
        sd = {rename(k): v for k, v in sd.items()}
    torch.save(sd, path / "pytorch_model.bin")
    (path / "config.json").write_text(json.dumps(config_to_json(draft.cfg, "sglang")))
    return path


def _same_draft(a, b):
    for k, v in a.state_dict().items():
        assert torch.equal(b.state_dict()[k], v), k


@pytest.mark.parametrize("embed", [True, False])
def test_pytorch_model_bin(target, tmp_path, embed):
    draft = make_draft(target, seed=6, bf16=False)
    path = _eagle_reference_dir(draft, tmp_path / "eagle", embed=embed)
    assert not (path / "model.safetensors").exists()
    loaded = load_draft(path, target=target)
    _same_draft(draft, loaded)
    ids, fused = _inputs()
    with torch.no_grad():
        for w, g in zip(draft.ttt_forward(ids, fused, 2), loaded.ttt_forward(ids, fused, 2)):
            torch.testing.assert_close(g, w, atol=1e-6, rtol=0)


def test_pytorch_model_bin_own_embedding_wins(target, tmp_path):
    """As in SGLang and vLLM, a shipped embedding is used rather than the target's."""
    draft = make_draft(target, seed=6, bf16=False)
    with torch.no_grad():
        draft.embed_tokens.weight.mul_(2.0)
    loaded = load_draft(_eagle_reference_dir(draft, tmp_path / "eagle"), target=target)
    assert torch.equal(loaded.embed_tokens.weight, draft.embed_tokens.weight)


@pytest.mark.parametrize("rename", [
    lambda k: "layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k,     # speculators names
    lambda k: k if k.startswith(("lm_head", "d2t", "t2d")) else "model." + k,          # HF-style wrapper
])
def test_pytorch_model_bin_other_key_names(target, tmp_path, rename):
    draft = make_draft(target, seed=6, bf16=False)
    _same_draft(draft,
                load_draft(_eagle_reference_dir(draft, tmp_path / "eagle", rename=rename), target=target))


def test_pytorch_model_bin_missing_keys_are_listed(target, tmp_path):
    draft = make_draft(target, seed=6, bf16=False)
    drop = {"norm.weight", "midlayer.hidden_norm.weight"}
    path = _eagle_reference_dir(draft, tmp_path / "eagle", rename=lambda k: "gone." + k if k in drop else k)
    _expect_untouched(path, target, lambda: load_draft(path, target=target), DraftFormatError,
                      r"missing \['midlayer.hidden_norm.weight', 'norm.weight'\], unexpected "
                      r"\['gone.midlayer.hidden_norm.weight', 'gone.norm.weight'\]")


def test_pytorch_model_bin_non_tensor_entries(target, tmp_path):
    path = tmp_path / "eagle"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": [SGLANG_ARCH], "hidden_size": H,
                                                  "intermediate_size": 3 * H, "num_attention_heads": 4,
                                                  "vocab_size": VOCAB}))
    torch.save({"fc.weight": torch.zeros(H, 3 * H), "step": 7}, path / "pytorch_model.bin")
    _expect_untouched(path, target, lambda: load_draft(path, target=target), DraftFormatError,
                      r"non-tensor entries \[\"'step' \(int\)\"\]")


class _NotWeights:
    pass


def test_pytorch_model_bin_is_read_weights_only(target, tmp_path):
    """A pickle that would run code on load (here: rebuild an arbitrary class) is refused."""
    path = tmp_path / "eagle"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": [SGLANG_ARCH], "hidden_size": H,
                                                  "intermediate_size": 3 * H, "num_attention_heads": 4,
                                                  "vocab_size": VOCAB}))
    torch.save({"fc.weight": _NotWeights()}, path / "pytorch_model.bin")
    _expect_untouched(path, target, lambda: load_draft(path, target=target), DraftFormatError,
                      "not a weights-only PyTorch state dict")


def _shard(path: Path):
    """Split model.safetensors into two shards plus an index, as save_pretrained does."""
    w = load_file(str(path / "model.safetensors"))
    names = sorted(w)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for f, keys in halves.items():
        save_file({k: w[k] for k in keys}, str(path / f), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: f for f, keys in halves.items() for k in keys}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    (path / "model.safetensors").unlink()


@pytest.mark.parametrize("fmt", FORMATS)
def test_sharded_safetensors(saved, target, fmt):
    draft, path = saved(fmt)
    _shard(path)
    _same_draft(draft, load_draft(path, target=target))


def test_sharded_safetensors_missing_shard(saved, target):
    _, path = saved("sglang")
    _shard(path)
    (path / "model-00002-of-00002.safetensors").unlink()
    _expect_untouched(path, target, lambda: load_draft(path, target=target), FileNotFoundError,
                      "names shard model-00002-of-00002.safetensors, which is not in")


def test_sharded_safetensors_key_not_in_its_shard(saved, target):
    _, path = saved("sglang")
    _shard(path)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    index["weight_map"]["midlayer.extra.weight"] = "model-00001-of-00002.safetensors"
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    _expect_untouched(path, target, lambda: load_draft(path, target=target), DraftFormatError,
                      r"maps tensors its shards do not hold: \['midlayer.extra.weight \(in model-00001")


def test_missing_weights_lists_what_was_looked_for(saved, target):
    _, path = saved("sglang")
    (path / "model.safetensors").unlink()
    _expect_untouched(path, target, lambda: load_draft(path, target=target), FileNotFoundError,
                      "expected one of model.safetensors, model.safetensors.index.json, pytorch_model.bin")


def test_second_decoder_layer_is_refused(saved, target):
    _, path = saved("speculators")
    _edit_weights(path, lambda w: w.update({"layers.1.mlp.down_proj.weight": torch.zeros(H, 3 * H)}))
    _expect_untouched(path, target, lambda: load_draft(path, target=target), DraftFormatError,
                      r"more decoder layers \(layers.1.\*\)")


def test_both_layer_prefixes_is_refused(saved, target):
    _, path = saved("sglang")
    _edit_weights(path, lambda w: w.update(
        {"layers.0.hidden_norm.weight": w["midlayer.hidden_norm.weight"].clone()}))
    _expect_untouched(path, target, lambda: load_draft(path, target=target), DraftFormatError,
                      "two names for the draft's midlayer.hidden_norm.weight")


def test_verifier_head_beside_the_draft_is_ignored(saved, target):
    draft, path = saved("speculators")
    _edit_weights(path, lambda w: w.update({"verifier_lm_head.weight": torch.zeros(VOCAB, H),
                                            "verifier_norm.weight": torch.ones(H)}))
    _same_draft(draft, load_draft(path, target=target))


# -- a draft wider than its target ---------------------------------------------------------------


WIDE = 48


def _wide_draft(seed: int = 7) -> Eagle3Draft:
    """Draft hidden 48 on a 32-wide target: fc [48, 3 x 32], its own embedding [VOCAB, 48]."""
    cfg = DraftConfig(hidden_size=WIDE, intermediate_size=2 * WIDE, num_attention_heads=4,
                      num_key_value_heads=4, head_dim=WIDE // 4, vocab_size=VOCAB,
                      draft_vocab_size=DRAFT_VOCAB, target_hidden_size=H, eagle_ids=IDS)
    torch.manual_seed(seed)
    draft = Eagle3Draft(cfg)
    with torch.no_grad():
        draft.embed_tokens.weight.normal_()
        d2t, t2d = vocab_maps(_draft_target_ids(seed), VOCAB)
        draft.d2t.copy_(d2t)
        draft.t2d.copy_(t2d)
    return draft.eval()


@pytest.mark.parametrize("fmt", FORMATS)
def test_wide_draft_with_its_own_embedding(target, tmp_path, fmt):
    draft = _wide_draft()
    path = save_draft(draft, tmp_path / fmt, fmt=fmt, dtype=torch.float32)
    w = load_file(str(path / "model.safetensors"))
    assert w["embed_tokens.weight"].shape == (VOCAB, WIDE)      # written because it cannot be borrowed
    assert w["fc.weight"].shape == (WIDE, 3 * H)
    loaded = load_draft(path, target=target)
    assert (loaded.cfg.hidden_size, loaded.cfg.target_hidden_size, loaded.cfg.num_aux) == (WIDE, H, 3)
    _same_draft(draft, loaded)
    ids, fused = _inputs()
    with torch.no_grad():
        for w_, g in zip(draft.ttt_forward(ids, fused, 2), loaded.ttt_forward(ids, fused, 2)):
            torch.testing.assert_close(g, w_, atol=1e-6, rtol=0)


def test_wide_draft_without_embedding_is_refused(target, tmp_path):
    path = save_draft(_wide_draft(), tmp_path / "wide", with_embedding=False)
    _expect_untouched(path, target, lambda: load_draft(path, target=target), DraftFormatError,
                      rf"draft hidden size {WIDE} differs from the target's embedding width {H}, so it "
                      rf"cannot share it: expected the checkpoint to ship its own embed_tokens.weight "
                      rf"\[{VOCAB}, {WIDE}\]; it has none")


def test_wide_draft_embedding_of_the_wrong_width(target, tmp_path):
    path = save_draft(_wide_draft(), tmp_path / "wide")
    _edit_weights(path,
                  lambda w: w.update({"embed_tokens.weight": torch.zeros(VOCAB, H, dtype=torch.bfloat16)}))
    _expect_untouched(path, target, lambda: load_draft(path, target=target), DraftFormatError,
                      rf"embed_tokens.weight \({VOCAB}, {H}\) \(config implies \({VOCAB}, {WIDE}\)\)")


def test_check_fits_target_accepts_own_embedding(target):
    cfg = _wide_draft().cfg
    with pytest.raises(DraftFormatError, match="cannot share"):
        check_fits_target(cfg, target)
    check_fits_target(cfg, target, has_own_embedding=True)


@pytest.mark.parametrize("fc_in, match", [
    (3 * H,
     rf"draft expects target hidden size {WIDE}; the target has {H} \(the config has no target_hidden_size"),
    (3 * H + 8,
     rf"input width {3 * H + 8} is not a multiple of the target hidden size {WIDE} \(the config has no "
                rf"target_hidden_size"),
])
def test_wide_draft_config_without_target_hidden_size(target, tmp_path, fc_in, match):
    """Without target_hidden_size the draft's own width is assumed; the error says so."""
    path = save_draft(_wide_draft(), tmp_path / "wide")
    _edit_config(path, lambda c: c.pop("target_hidden_size"))
    _edit_weights(path, lambda w: w.update({"fc.weight": torch.zeros(WIDE, fc_in, dtype=torch.bfloat16)}))
    _expect_untouched(path, target, lambda: load_draft(path, target=target), DraftFormatError, match)


def test_run_as_sglang_drops_norm_before_residual_only_inside_the_block(tmp_path):
    """Emulating SGLang means its forward too: inside the block a flagged draft computes what the
    same weights compute unflagged; outside, and under vLLM, the trained forward is back."""
    import shutil

    from helpers.model.checkpoint import load_draft
    from helpers.model.draft import ServingMismatchWarning, run_as
    from helpers.model.target import load_target

    data = Path(__file__).resolve().parent.parent / "data" / "tiny-kimi"
    target, _ = load_target(data / "target")
    flagged = tmp_path / "flagged"
    shutil.copytree(data / "draft", flagged)
    cfg = json.loads((flagged / "config.json").read_text())
    cfg["norm_before_residual"] = True
    (flagged / "config.json").write_text(json.dumps(cfg))
    with pytest.warns(ServingMismatchWarning):
        d = load_draft(flagged, target=target)
    plain = load_draft(data / "draft", target=target)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 4096, (1, 24), generator=gen)
    fused = torch.randn(1, 24, d.cfg.fc_in, generator=gen)
    with torch.no_grad():
        trained = d.ttt_forward(ids, fused, 2)
        with run_as(d, parse_engine("sglang==0.5.9")) as notes:
            served = d.ttt_forward(ids, fused, 2)
        with run_as(d, parse_engine("vllm")) as vllm_notes:
            honoured = d.ttt_forward(ids, fused, 2)
        reference = plain.ttt_forward(ids, fused, 2)
    assert notes and "norm_before_residual ignored" in notes[0] and not vllm_notes
    assert d.cfg.norm_before_residual is True
    for a, b in zip(served, reference):
        assert torch.allclose(a, b, atol=1e-5)
    assert not torch.allclose(trained[0], reference[0], atol=1e-3)
    assert all(torch.equal(a, b) for a, b in zip(trained, honoured))
