"""Residual-stream capture at boundaries, against Hugging Face's own ``output_hidden_states``.

In transformers 5.x ``hidden_states[b]`` is boundary b for b < L, and ``hidden_states[L]``
is taken *after* the final norm (docs/conventions.md); the capture must give the pre-norm
state at L, and the same values during cached decoding as in a full forward.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers.boundaries import WiringError
from helpers.model.capture import capture_boundaries, decoder_parts, named, num_layers_of, run_and_capture

ARCHS = ("llama", "qwen2", "qwen3", "deepseek_v3")
CLASS_OF = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
            "deepseek_v3": "DeepseekV3ForCausalLM"}
NUM_LAYERS = 3
ATOL = 1e-5


def _ids(n: int, seed: int = 1, batch: int = 1, vocab: int = 128) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, n), generator=g)


def _hook_counts(model) -> list[int]:
    _, layers, norm = decoder_parts(model)
    return [len(m._forward_pre_hooks) for m in list(layers) + [norm]]


@pytest.fixture(scope="module", params=ARCHS)
def model(request, make_tiny_lm):
    m = make_tiny_lm(request.param, seed=0, layers=NUM_LAYERS)
    assert type(m).__name__ == CLASS_OF[request.param]
    return m


def test_deepseek_tiny_has_mla_and_moe(make_tiny_lm):
    """The DeepSeek model really exercises MLA and a MoE layer after the dense one."""
    m = make_tiny_lm("deepseek_v3", layers=NUM_LAYERS)
    mlps = [type(layer.mlp).__name__ for layer in m.model.layers]
    assert mlps[0] == "DeepseekV3MLP" and all(n == "DeepseekV3MoE" for n in mlps[1:])
    assert m.config.q_lora_rank is None and m.config.kv_lora_rank == 16
    assert hasattr(m.model.layers[0].self_attn, "kv_a_proj_with_mqa")


def test_num_layers(model):
    assert num_layers_of(model) == NUM_LAYERS


def test_capture_matches_hidden_states_below_L(model):
    ids = _ids(9, batch=2)
    out, store = run_and_capture(model, ids, range(NUM_LAYERS + 1), output_hidden_states=True)
    hs = out.hidden_states
    assert len(hs) == NUM_LAYERS + 1
    assert sorted(store) == list(range(NUM_LAYERS + 1))
    for b in range(NUM_LAYERS):
        assert store[b].shape == (2, 9, model.config.hidden_size)
        torch.testing.assert_close(store[b], hs[b], atol=ATOL, rtol=0, msg=f"boundary {b}")
    # Boundary 0 is the embedding output itself.
    torch.testing.assert_close(store[0], model.get_input_embeddings()(ids), atol=ATOL, rtol=0)


def test_boundary_L_is_before_the_final_norm(model):
    ids = _ids(9)
    out, store = run_and_capture(model, ids, [NUM_LAYERS], output_hidden_states=True)
    final_hf = out.hidden_states[NUM_LAYERS]
    # HF's last entry is post-norm: the raw capture must differ from it, or this test proves nothing.
    assert not torch.allclose(store[NUM_LAYERS], final_hf, atol=1e-3), \
        "captured boundary L equals HF's hidden_states[L]: is hidden_states[L] no longer post-norm?"
    with torch.no_grad():
        torch.testing.assert_close(model.model.norm(store[NUM_LAYERS]), final_hf, atol=ATOL, rtol=0)
        # ... and it is what the LM head reads after the norm.
        torch.testing.assert_close(model.lm_head(model.model.norm(store[NUM_LAYERS])), out.logits,
                                   atol=1e-4, rtol=0)


def test_capture_subset_only(model):
    _, store = run_and_capture(model, _ids(5), [2, 0])
    assert sorted(store) == [0, 2]


def test_cached_decoding_matches_full_forward(model):
    from transformers import DynamicCache

    ids = _ids(9, seed=3)
    bounds = range(NUM_LAYERS + 1)
    _, full = run_and_capture(model, ids, bounds)
    cache = DynamicCache(config=model.config)
    _, pre = run_and_capture(model, ids[:, :8], bounds, past_key_values=cache, use_cache=True)
    assert cache.get_seq_length() == 8
    out, step = run_and_capture(model, ids[:, 8:], bounds, past_key_values=cache, use_cache=True)
    assert cache.get_seq_length() == 9
    for b in bounds:
        assert step[b].shape == (1, 1, model.config.hidden_size)
        torch.testing.assert_close(step[b][:, 0], full[b][:, -1], atol=1e-4, rtol=0, msg=f"boundary {b}")
        torch.testing.assert_close(pre[b], full[b][:, :8], atol=1e-4, rtol=0, msg=f"prefill boundary {b}")


def test_store_holds_the_last_call(model):
    """Inside one context every forward overwrites the store (prefill, then a decode step)."""
    from transformers import DynamicCache

    ids = _ids(6, seed=4)
    cache = DynamicCache(config=model.config)
    with torch.no_grad(), capture_boundaries(model, [1, NUM_LAYERS]) as store:
        model(input_ids=ids[:, :5], past_key_values=cache, use_cache=True)
        assert store[1].shape[1] == 5
        model(input_ids=ids[:, 5:], past_key_values=cache, use_cache=True)
        assert store[1].shape[1] == 1 and store[NUM_LAYERS].shape[1] == 1


def test_named_keys():
    store = {3: torch.zeros(1), 0: torch.ones(1)}
    assert list(named(store)) == ["resid.0", "resid.3"]


# -- bad input and cleanup --------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, NUM_LAYERS + 1, 99])
def test_boundary_out_of_range(model, bad):
    before = _hook_counts(model)
    with pytest.raises(WiringError, match=rf"outside 0\.\.{NUM_LAYERS}"):
        with capture_boundaries(model, [0, bad]):
            pytest.fail("the body must not run")
    assert _hook_counts(model) == before
    with pytest.raises(WiringError, match=rf"outside 0\.\.{NUM_LAYERS}"):
        run_and_capture(model, _ids(3), [bad])
    assert _hook_counts(model) == before


def test_hooks_removed_after_context(model):
    assert _hook_counts(model) == [0] * (NUM_LAYERS + 1)
    with capture_boundaries(model, range(NUM_LAYERS + 1)):
        assert _hook_counts(model) == [1] * (NUM_LAYERS + 1)
    assert _hook_counts(model) == [0] * (NUM_LAYERS + 1)
    run_and_capture(model, _ids(3), [0, NUM_LAYERS])
    assert _hook_counts(model) == [0] * (NUM_LAYERS + 1)


def test_hooks_removed_when_body_raises(model):
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with capture_boundaries(model, [0, 1, NUM_LAYERS]):
            with torch.no_grad():
                model(input_ids=_ids(3))
            raise Boom()
    assert _hook_counts(model) == [0] * (NUM_LAYERS + 1)
    # The model still runs normally and nothing is captured afterwards.
    with capture_boundaries(model, []) as store:
        with torch.no_grad():
            model(input_ids=_ids(3))
    assert store == {}


def test_hooks_removed_when_forward_raises(model):
    with pytest.raises((IndexError, RuntimeError)):
        with capture_boundaries(model, [0, NUM_LAYERS]):
            model(input_ids=torch.tensor([[10 ** 6]]))       # id outside the vocabulary
    assert _hook_counts(model) == [0] * (NUM_LAYERS + 1)


# -- other model shapes (plain modules, no transformers) -------------------------------------------


class _KwLayer(nn.Module):
    """A decoder layer that is called with ``hidden_states=`` as a keyword."""

    def __init__(self, k: float):
        super().__init__()
        self.k = k

    def forward(self, hidden_states):
        return hidden_states + self.k


class _KwInner(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([_KwLayer(1.0), _KwLayer(10.0)])
        self.norm = nn.Identity()

    def forward(self, x):
        for layer in self.layers:
            x = layer(hidden_states=x)
        return self.norm(x)


class _Wrapper(nn.Module):
    def __init__(self, inner, multimodal: bool = False):
        super().__init__()
        if multimodal:
            self.model = nn.Module()
            self.model.language_model = inner
        else:
            self.model = inner
        self.inner = inner

    def forward(self, input_ids):
        return self.inner(input_ids.float())


@pytest.mark.parametrize("multimodal", [False, True])
def test_keyword_calls_and_language_model_wrappers(multimodal):
    m = _Wrapper(_KwInner(), multimodal=multimodal)
    assert num_layers_of(m) == 2
    _, store = run_and_capture(m, torch.zeros(1, 2), [0, 1, 2])
    assert store[0].tolist() == [[0.0, 0.0]]
    assert store[1].tolist() == [[1.0, 1.0]]
    assert store[2].tolist() == [[11.0, 11.0]]


def test_model_without_layers_is_rejected():
    with pytest.raises(TypeError, match="no `.model.layers`"):
        num_layers_of(nn.Linear(2, 2))
