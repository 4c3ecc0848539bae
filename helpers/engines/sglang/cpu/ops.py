"""Torch implementations of the ``sgl_kernel`` CPU ops an EAGLE-3 run of SGLang 0.5.23 calls.

No CPU build of ``sgl_kernel`` exists on the registry (docs/sglang-cpu.md), so the workbook supplies
these ten ops itself, written from each op's contract as its caller in the 0.5.23 wheel and the
CUDA/Triton twin beside it state it. Every op works on the whole batch with tensor operations: the
only Python loops run over the draft tree's fixed dimensions (draft tokens, steps, KV buffers), never
over requests, so an SGLang tok/s figure on CPU measures batched tensor work rather than interpreter
overhead per request. They are plain functions with no sglang import, so tests check each one against
a direct computation in the notebooks' venv (tests/test_sglang_cpu_ops.py).

Where a feature the EAGLE-3 runs here never reach would need more (sliding windows, attention sinks,
cross-attention, bit-packed tree masks), the op raises ``NotImplementedError`` naming it rather than
computing something else.
"""
from __future__ import annotations

import ctypes

import torch

# --------------------------------------------------------------------------- attention


def _unsupported(op: str, sliding_window: int, is_cross: bool, sinks) -> None:
    if sliding_window is not None and sliding_window > 0:
        raise NotImplementedError(f"sgl_kernel stand-in: {op} with a sliding window ({sliding_window - 1})")
    if is_cross:
        raise NotImplementedError(f"sgl_kernel stand-in: {op} for cross-attention")
    if sinks is not None:
        raise NotImplementedError(f"sgl_kernel stand-in: {op} with attention sinks")


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, sm_scale: float,
            logit_cap: float) -> torch.Tensor:
    """Masked attention over padded batches, in float32.

    q [B, Q, H, D], k [B, S, Hkv, D], v [B, S, Hkv, Dv], visible [B, Q, S] -> [B, Q, H, Dv]. Query heads
    share key heads in groups of H // Hkv (GQA; MLA's latent cache is the Hkv = 1 case).
    """
    b, nq, h, _ = q.shape
    hkv = k.shape[2]
    qg = q.float().reshape(b, nq, hkv, h // hkv, q.shape[-1])
    scores = torch.einsum("bqgrd,bsgd->bgrqs", qg, k.float()) * sm_scale
    if logit_cap and logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    scores = scores.masked_fill(~visible[:, None, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)   # a query that sees nothing gives zeros
    out = torch.einsum("bgrqs,bsgd->bqgrd", probs, v.float())
    return out.reshape(b, nq, h, v.shape[-1])


def _read(buffer: torch.Tensor, slots: torch.Tensor, scale) -> torch.Tensor:
    """Cached rows at ``slots``; an fp8 cache is stored divided by its scale, so it is multiplied back."""
    rows = buffer[slots]
    if buffer.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        rows = rows.float() * float(scale or 1.0)
    return rows


def decode_attention_cpu(q, k_buffer, v_buffer, key_scale, value_scale, output, k_new, v_new, loc,
                         attn_logits, req_to_token, req_pool_indices, seq_lens, sm_scale, logit_cap,
                         is_cross_attention=False, sliding_window_size=0, encoder_lens=None, sinks=None):
    """One new token per sequence attends to its whole cached sequence.

    Contract (``intel_amx_backend.py`` ``forward_decode``): ``seq_lens`` already counts the new token,
    whose K/V (``k_new``/``v_new``, when not None) the op writes at ``loc`` into the buffers before
    reading; sequence i reads slots ``req_to_token[req_pool_indices[i], :seq_lens[i]]``; the result goes
    into ``output`` [T, H, Dv]. ``attn_logits`` is the CPU kernel's split-K scratch: unused here.
    """
    _unsupported("decode_attention_cpu", sliding_window_size, is_cross_attention, sinks)
    if k_new is not None and v_new is not None:          # None: the backend stored them already (fp8)
        k_buffer[loc.long()] = k_new.to(k_buffer.dtype)
        v_buffer[loc.long()] = v_new.to(v_buffer.dtype)
    lens = seq_lens.long()
    width = int(lens.max()) if lens.numel() else 0
    cols = torch.arange(width, device=q.device)
    slots = req_to_token[req_pool_indices.long(), :width].long()            # [B, S]
    visible = cols[None, :] < lens[:, None]                                  # [B, S]
    slots = torch.where(visible, slots, torch.zeros_like(slots))
    k, v = _read(k_buffer, slots, key_scale), _read(v_buffer, slots, value_scale)
    out = _attend(q[:, None], k, v, visible[:, None, :], sm_scale, logit_cap)
    output.copy_(out[:, 0].to(output.dtype))


def extend_attention_cpu(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, key_scale, value_scale,
                         req_to_token, req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc,
                         max_len_extend, sm_scale, logit_cap, is_cross_attention=False, sliding_window_size=0,
                         encoder_lens=None, sinks=None, custom_mask=None, is_causal=True):
    """New tokens of each sequence (prefill, or the verify of a draft) attend to prefix and themselves.

    Contract (``intel_amx_backend.py`` ``forward_extend``): sequence i has ``seq_lens[i]`` tokens in all,
    its last ``extend_seq_lens[i]`` being new, at rows ``extend_start_loc[i]...`` of ``q_extend``; its
    prefix is read from the buffers through ``req_to_token``, the new keys and values from
    ``k_extend``/``v_extend`` (read from the buffers too when those are None). ``custom_mask`` (a tree
    of drafts, topk > 1) is, per sequence, ``extend_len x seq_len`` booleans row-major, concatenated.
    """
    _unsupported("extend_attention_cpu", sliding_window_size, is_cross_attention, sinks)
    dev = q_extend.device
    lens, ext = seq_lens.long(), extend_seq_lens.long()
    starts, prefix = extend_start_loc.long(), lens - ext
    e_max, s_max = int(ext.max()), int(lens.max())
    qi = torch.arange(e_max, device=dev)
    q_valid = qi[None, :] < ext[:, None]                                      # [B, E]
    q_rows = torch.where(q_valid, starts[:, None] + qi[None, :], torch.zeros_like(q_valid, dtype=torch.long))
    q = q_extend[q_rows]                                                      # [B, E, H, D]
    kj = torch.arange(s_max, device=dev)
    k_valid = kj[None, :] < lens[:, None]                                     # [B, S]
    in_prefix = kj[None, :] < prefix[:, None]
    slots = req_to_token[req_pool_indices.long(), :s_max].long()
    slots = torch.where(k_valid, slots, torch.zeros_like(slots))
    k, v = _read(k_buffer, slots, key_scale), _read(v_buffer, slots, value_scale)
    if k_extend is not None and v_extend is not None:
        if k_extend.shape[1:] != k_buffer.shape[1:] and bool(prefix.gt(0).any()):
            raise NotImplementedError("sgl_kernel stand-in: extend_attention_cpu with per-head keys "
                                      "(MHA-style MLA prefill) over a cached prefix")
        last_row = max(k_extend.shape[0] - 1, 0)
        new_rows = (starts[:, None] + kj[None, :] - prefix[:, None]).clamp(min=0, max=last_row)
        use_new = (~in_prefix) & k_valid
        k_new, v_new = k_extend[new_rows], v_extend[new_rows]
        if k_new.shape != k.shape:          # MHA-style prefill without a prefix: nothing comes from the cache
            k, v = k_new, v_new
        else:
            k = torch.where(use_new[..., None, None], k_new.to(k.dtype), k)
            v = torch.where(use_new[..., None, None], v_new.to(v.dtype), v)
    visible = k_valid[:, None, :] & q_valid[:, :, None]                      # [B, E, S]
    if custom_mask is not None and custom_mask.numel() > 0:
        per_seq = ext * lens
        base = torch.cumsum(per_seq, 0) - per_seq
        idx = base[:, None, None] + qi[None, :, None] * lens[:, None, None] + kj[None, None, :]
        idx = torch.where(visible, idx, torch.zeros_like(idx))
        visible = visible & custom_mask.reshape(-1)[idx].bool()
    elif is_causal:
        visible = visible & (kj[None, None, :] <= (prefix[:, None] + qi[None, :])[:, :, None])
    out = _attend(q, k, v, visible, sm_scale, logit_cap)                     # [B, E, H, Dv]
    o_extend[q_rows[q_valid]] = out[q_valid].to(o_extend.dtype)


# --------------------------------------------------------------------------- draft bookkeeping


def build_draft_decode_metadata_cpu(req_to_token, req_pool_indices, seq_lens, topk, num_steps, pool_len):
    """The slot table draft decode steps read: one row per (request, candidate).

    Row ``i * topk + c`` holds request i's prefix slots, then the slots of candidate c's draft tokens,
    which the contiguous allocation put at ``seq_len + c * num_steps + step`` of the request's row (the
    layout ``generate_draft_decode_kv_indices`` reads on CUDA, ``cache_locs.py``). Columns past
    ``seq_len + num_steps`` are zero.
    """
    lens = seq_lens.long().repeat_interleave(topk)                            # [B*topk]
    rows = req_pool_indices.long().repeat_interleave(topk)
    cand = torch.arange(topk, device=lens.device).repeat(seq_lens.numel())
    col = torch.arange(pool_len, device=lens.device)[None, :]
    src = torch.where(col < lens[:, None], col, col + cand[:, None] * num_steps)
    keep = col < (lens + num_steps)[:, None]
    src = torch.where(keep, src, torch.zeros_like(src)).clamp(max=req_to_token.shape[1] - 1)
    out = req_to_token[rows[:, None], src]
    return torch.where(keep, out, torch.zeros_like(out))


def _copy_windows(req_to_token, req_pool_indices, start_offset, end_offset, flat, pool_len, into_pool):
    """Shared by the two slot copies: request i's window [start, end) of its req_to_token row, against
    the packed run of ``flat`` that follows the windows of requests before it."""
    del pool_len                                     # the row stride is req_to_token's own
    start, end = start_offset.long(), end_offset.long()
    length = (end - start).clamp(min=0)
    if length.numel() == 0 or int(length.sum()) == 0:
        return
    packed = torch.cumsum(length, 0) - length
    req = torch.repeat_interleave(torch.arange(length.numel(), device=length.device), length)
    within = torch.arange(int(length.sum()), device=length.device) - packed[req]
    rows, cols, pos = req_pool_indices.long()[req], start[req] + within, packed[req] + within
    if into_pool:
        req_to_token[rows, cols] = flat[pos].to(req_to_token.dtype)
    else:
        flat[pos] = req_to_token[rows, cols].to(flat.dtype)


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len):
    """Write the packed ``out_cache_loc`` into each request's row at [start, end) (``allocation.py``)."""
    _copy_windows(req_to_token, req_pool_indices, start_offset, end_offset, out_cache_loc, pool_len, True)


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len):
    """Read each request's slots [start, end) into ``out_cache_loc``, packed (``cache_locs.py``)."""
    _copy_windows(req_to_token, req_pool_indices, start_offset, end_offset, out_cache_loc, pool_len, False)


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len,
                                           topk, num_steps):
    """Copy each request's ``topk * num_steps`` slots from ``seq_lens`` on into ``out_cache_loc``
    (``[bs * topk * num_steps]``, request-major), as ``assign_draft_cache_locs_contiguous`` does."""
    width = topk * num_steps
    cols = seq_lens.long()[:, None] + torch.arange(width, device=seq_lens.device)[None, :]
    vals = req_to_token[req_pool_indices.long()[:, None], cols]
    out_cache_loc.view(-1)[: vals.numel()] = vals.reshape(-1).to(out_cache_loc.dtype)


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride):
    """Each request's last accepted token (its bonus), at ``accept_stride * i + accept_len - 1``."""
    i = torch.arange(accept_lens.numel(), device=accept_lens.device)
    picked = accept_tokens.reshape(-1)[i * accept_stride + accept_lens.long() - 1]
    bonus_tokens.copy_(picked.to(bonus_tokens.dtype))


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc):
    """The cache slots of accepted tokens, packed in order (entries of -1 in ``accept_index`` skipped)."""
    flat = accept_index.reshape(-1)
    keep = flat != -1
    vals = out_cache_loc[flat[keep].long()]
    accept_out_cache_loc[: vals.numel()] = vals.to(accept_out_cache_loc.dtype)


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """For every KV buffer (one raw pointer and a row stride in bytes each), copy rows ``src_loc`` to
    ``tgt_loc`` (``memory_pool.py`` moves slots this way after a verify). The loop runs over buffers
    (2 per layer), each copy over all rows at once through a byte view of the buffer."""
    if tgt_loc.numel() == 0:
        return
    src, tgt = src_loc.long(), tgt_loc.long()
    rows = int(torch.maximum(src.max(), tgt.max())) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        stride = int(stride)
        raw = (ctypes.c_uint8 * (rows * stride)).from_address(int(ptr) & (2 ** 64 - 1))
        view = torch.frombuffer(raw, dtype=torch.uint8).view(rows, stride)
        view[tgt] = view[src]


# --------------------------------------------------------------------------- tree build and verify

FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2


def _tree_parents(parent_list, selected, topk):
    """For each draft token x >= 1 of each request, the draft position of its parent: 0 for the
    verified root, -1 when the parent is not among the selected tokens (the kernel then stops)."""
    bsz = selected.shape[0]
    parent_tb = torch.div(selected.long(), topk, rounding_mode="floor")            # [B, n-1]
    plist = parent_list.reshape(bsz, -1).long()
    parent_tok = plist.gather(1, parent_tb.clamp(max=plist.shape[1] - 1))
    hit = selected.long()[:, None, :] == parent_tok[:, :, None]                    # [B, x, pp]
    first = torch.where(hit.any(-1), hit.float().argmax(-1) + 1, torch.full_like(parent_tb, -1))
    parents = torch.where(parent_tb == 0, torch.zeros_like(parent_tb), first)
    return torch.cat([torch.full((bsz, 1), -1, dtype=torch.long, device=selected.device), parents], 1)


def build_tree_kernel_efficient_cpu(parent_list, selected_index, verified_seq_len, tree_mask, positions,
                                    retrive_index, retrive_next_token, retrive_next_sibling, topk, depth,
                                    draft_token_num, tree_mask_mode):
    """The draft tree's verify inputs from the drafted candidates (``spec_tree.py``'s Triton twin):
    retrieve links (first child, next sibling), positions (seq_len + depth) and the attention mask
    among draft tokens. Loops run over the n draft tokens and the depth; every request at once."""
    mode = int(tree_mask_mode)
    if mode == QLEN_ONLY_BITPACKING:
        raise NotImplementedError("sgl_kernel stand-in: build_tree_kernel_efficient_cpu, bit-packed mask")
    n, dev = int(draft_token_num), verified_seq_len.device
    bsz = verified_seq_len.numel()
    seq = verified_seq_len.long()
    ar = torch.arange(bsz, device=dev)
    parents = _tree_parents(parent_list, selected_index[:, : n - 1], topk)        # [B, n]
    r_index = retrive_index.view(bsz, n)
    r_index.copy_((ar[:, None] * n + torch.arange(n, device=dev)[None, :]).to(r_index.dtype))
    nxt, sib = retrive_next_token.view(bsz, n), retrive_next_sibling.view(bsz, n)
    for i in range(n - 1, 0, -1):                  # the kernel's reverse order gives its sibling chains
        par = parents[:, i]
        ok = par >= 0
        if not bool(ok.any()):
            continue
        b, p = ar[ok], par[ok]
        prev = nxt[b, p].clone()
        nxt[b, p] = i
        linked = prev != -1
        sib[b[linked], i] = prev[linked].to(sib.dtype)
    # ancestors: walk every token's parent chain at once, at most `depth` steps
    anc = torch.zeros(bsz, n, n, dtype=torch.bool, device=dev)
    anc[:, :, 0] = True
    cur = torch.arange(n, device=dev).expand(bsz, n).clone()
    alive = cur > 0
    depth_of = torch.zeros(bsz, n, dtype=torch.long, device=dev)
    for _ in range(int(depth)):
        if not bool(alive.any()):
            break
        b, x = alive.nonzero(as_tuple=True)
        anc[b, x, cur[b, x]] = True
        depth_of = depth_of + alive.long()
        nxt_cur = parents.gather(1, cur.clamp(min=0))
        alive = alive & (nxt_cur > 0)
        cur = torch.where(alive, nxt_cur, cur)
    positions.view(bsz, n).copy_((seq[:, None] + depth_of).to(positions.dtype))
    flat = tree_mask.view(-1)
    if mode == FULL_MASK:
        # request b's rows are (seq_len + n) wide, starting after the earlier requests' blocks
        block = (seq + n) * n
        base = torch.cumsum(block, 0) - block
        width = seq + n
        x = torch.arange(n, device=dev)
        row0 = base[:, None] + width[:, None] * x[None, :] + seq[:, None]         # [B, n]: the root column
        idx = row0[:, :, None] + torch.arange(n, device=dev)[None, None, :]
    else:
        idx = (ar[:, None, None] * n * n + torch.arange(n, device=dev)[None, :, None] * n
               + torch.arange(n, device=dev)[None, None, :])
    flat[idx.reshape(-1)] = anc.reshape(-1).to(flat.dtype)


def verify_tree_greedy_cpu(predicts, accept_index, accept_token_num, candidates, retrive_index,
                           retrive_next_token, retrive_next_sibling, target_predict):
    """Greedy acceptance down the draft tree (``spec_tree.py``'s Triton twin): at each level take the
    child whose token equals the target's argmax at the last accepted node; record accepted indices,
    their count, and the target's token at each accepted node (the last one is the bonus). Loops run
    over levels and siblings; every request at once."""
    bsz, n = candidates.shape
    steps = accept_index.shape[1]
    dev = candidates.device
    ar = torch.arange(bsz, device=dev)
    r_index, cand = retrive_index.view(bsz, n).long(), candidates.long()
    nxt, sib = retrive_next_token.view(bsz, n).long(), retrive_next_sibling.view(bsz, n).long()
    target = target_predict.reshape(-1)
    pred = predicts.view(-1)
    last = r_index[:, 0].clone()
    accept_index[:, 0] = last.to(accept_index.dtype)
    num = torch.zeros(bsz, dtype=torch.long, device=dev)
    cur = torch.zeros(bsz, dtype=torch.long, device=dev)
    active = torch.ones(bsz, dtype=torch.bool, device=dev)
    for _ in range(1, steps):
        if not bool(active.any()):
            break
        cur = torch.where(active, nxt[ar, cur.clamp(min=0)], cur)
        want = target[last]
        searching, found = active.clone(), torch.zeros_like(active)
        for _ in range(n):
            if not bool(searching.any()):
                break
            valid = cur != -1
            safe = cur.clamp(min=0)
            d_index, d_token = r_index[ar, safe], cand[ar, safe]
            match = searching & valid & (d_token == want)
            if bool(match.any()):
                pred[last[match]] = want[match].to(pred.dtype)
                accept_index[ar[match], num[match] + 1] = d_index[match].to(accept_index.dtype)
            num = num + match.long()
            last = torch.where(match, d_index, last)
            found = found | match
            searching = searching & valid & ~match
            cur = torch.where(searching, sib[ar, safe], cur)
        active = active & found
    accept_token_num.copy_(num.to(accept_token_num.dtype))
    pred[last] = target[last].to(pred.dtype)


IMPLEMENTED = (
    "decode_attention_cpu", "extend_attention_cpu", "build_draft_decode_metadata_cpu",
    "copy_all_layer_kv_cache_cpu", "assign_draft_cache_locs_contiguous_cpu", "assign_extend_cache_locs_cpu",
    "fill_bonus_tokens_cpu", "fill_accept_out_cache_loc_cpu", "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu", "assign_req_to_token_pool_cpu",
)
