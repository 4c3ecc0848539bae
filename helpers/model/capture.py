"""Residual-stream capture at any boundary of a Hugging Face decoder-only model.

The capture point for boundary ``b < L`` is the hidden state handed *into* decoder layer
``b`` (a forward pre-hook on ``layers[b]``); for ``b == L`` it is the state handed into
the final norm. Hugging Face decoders keep the residual inside ``hidden_states`` between
layers, so the tensor entering a layer is exactly SGLang's ``hidden_states + residual`` at
the same point. Hooking (rather than ``output_hidden_states``) is what makes boundary L
available before the norm and keeps the same code working during cached decoding.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator

import torch
from torch import nn

from ..boundaries import capture_name, check_boundary


def decoder_parts(model: nn.Module) -> tuple[nn.Module, nn.ModuleList, nn.Module]:
    """(inner model, its decoder layers, its final norm) for Llama/Qwen/DeepSeek-style LMs."""
    inner = getattr(model, "model", model)
    # Multimodal wrappers hand text to a `language_model`.
    if not hasattr(inner, "layers") and hasattr(inner, "language_model"):
        inner = inner.language_model
    layers = getattr(inner, "layers", None)
    norm = getattr(inner, "norm", None)
    if layers is None or norm is None:
        raise TypeError(
            f"{type(model).__name__} has no `.model.layers` and `.model.norm`; expected a "
            "Llama/Qwen/DeepSeek-style causal LM"
        )
    return inner, layers, norm


def num_layers_of(model: nn.Module) -> int:
    return len(decoder_parts(model)[1])


def _hidden_from_call(args: tuple, kwargs: dict) -> torch.Tensor:
    if args:
        return args[0]
    if "hidden_states" in kwargs:
        return kwargs["hidden_states"]
    raise RuntimeError("could not find hidden_states in the decoder layer's call")


@contextmanager
def capture_boundaries(model: nn.Module, boundaries: Iterable[int]) -> Iterator[dict[int, torch.Tensor]]:
    """Within the block, every forward fills ``store[b]`` with the state at boundary ``b``.

    Each forward overwrites the previous capture, so the store always holds the last call
    (prefill or a decoding step) -- the same shape of data an engine hands its draft.
    """
    _, layers, norm = decoder_parts(model)
    num_layers = len(layers)
    wanted = sorted({check_boundary(int(b), num_layers) for b in boundaries})
    store: dict[int, torch.Tensor] = {}
    handles = []

    def make_hook(b: int):
        def hook(_module, args, kwargs):
            store[b] = _hidden_from_call(args, kwargs).detach()
        return hook

    try:
        for b in wanted:
            target = norm if b == num_layers else layers[b]
            handles.append(target.register_forward_pre_hook(make_hook(b), with_kwargs=True))
        yield store
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def run_and_capture(model: nn.Module, input_ids: torch.Tensor, boundaries: Iterable[int], **forward_kwargs):
    """One forward pass; returns (model output, {boundary: [batch, seq, H] tensor})."""
    with capture_boundaries(model, boundaries) as store:
        out = model(input_ids=input_ids, **forward_kwargs)
    return out, dict(store)


def named(store: dict[int, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same captures keyed by their stable names (``resid.{b}``)."""
    return {capture_name(b): t for b, t in sorted(store.items())}


@torch.no_grad()
def boundary_identities(model: nn.Module, input_ids: torch.Tensor):
    """What each captured boundary *is*, checked numerically on one forward.

    Returns a DataFrame: boundary 0 equals the embedding lookup; boundary b equals the
    output of layer b-1; boundary L, passed through the final norm, equals what
    ``output_hidden_states`` reports last (which is therefore *after* the norm).
    """
    import pandas as pd

    inner, layers, norm = decoder_parts(model)
    L = len(layers)
    outputs: dict[int, torch.Tensor] = {}

    def keep(i):
        def hook(_m, _a, out):
            outputs[i] = (out[0] if isinstance(out, tuple) else out).detach()
        return hook

    handles = [layer.register_forward_hook(keep(i)) for i, layer in enumerate(layers)]
    try:
        with capture_boundaries(model, range(L + 1)) as store:
            out = model(input_ids=input_ids, output_hidden_states=True, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    hs = out.hidden_states
    emb = model.get_input_embeddings()(input_ids)
    rows = [{"boundary": 0, "is": "embedding output embed_tokens(ids)",
             "max_abs_diff": float((store[0] - emb).abs().max())}]
    for b in (1, L // 2, L):
        rows.append({"boundary": b, "is": f"output of layer {b - 1} (input to layer {b})" if b < L else
                     f"output of layer {L - 1}, before the final norm",
                     "max_abs_diff": float((store[b] - outputs[b - 1]).abs().max())})
    rows.append({"boundary": L, "is": f"norm(boundary {L}) == output_hidden_states[{L}]",
                 "max_abs_diff": float((norm(store[L]) - hs[L]).abs().max())})
    rows.append({"boundary": L,
                 "is": f"raw boundary {L} vs output_hidden_states[{L}] (differs: that one is normed)",
                 "max_abs_diff": float((store[L] - hs[L]).abs().max())})
    return pd.DataFrame(rows)


@torch.no_grad()
def fused_boundaries(model: nn.Module, input_ids: torch.Tensor,
                     fused: torch.Tensor) -> tuple[list[int], float]:
    """Which boundary each slot of a live engine's fused draft input is: ``fused`` is what the draft's fc
    received for ``input_ids`` (its prefill rows, ``[T, k * H]``); each slot is matched to the boundary
    whose capture it equals. Returns the boundaries and the largest difference of a match (a measured
    layout with a difference far from 0 matched nothing)."""
    n = num_layers_of(model)
    _, store = run_and_capture(model, input_ids.reshape(1, -1), range(n + 1), use_cache=False)
    hidden = store[0].shape[-1]
    if fused.shape[-1] % hidden:
        raise ValueError(f"fused input is {tuple(fused.shape)}; expected slots of the target's width "
                         f"{hidden}")
    slots, worst = [], 0.0
    for s in range(fused.shape[-1] // hidden):
        chunk = fused[:, s * hidden:(s + 1) * hidden].float()
        diffs = [float((chunk - store[b][0].float()).abs().max()) for b in range(n + 1)]
        best = min(range(n + 1), key=diffs.__getitem__)
        slots.append(best)
        worst = max(worst, diffs[best])
    return slots, worst
