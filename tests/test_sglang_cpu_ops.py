"""Each op of the workbook's ``sgl_kernel`` stand-in against a direct torch computation.

The ops are SGLang 0.5.23's CPU kernels re-implemented over the batch (helpers/engines/sglang/cpu/ops.py); the
references here are written the slow, obvious way: one request at a time, one token at a time,
following the Triton twins' loops. No sglang is needed: the module is plain torch.
"""
from __future__ import annotations

import importlib
import sys

import pytest
import torch

from helpers.engines.sglang.cpu import SITE, UnsupportedRelease, check_release, ops

torch.manual_seed(0)


def _pool(bsz=3, pool_len=32, pool_rows=8, slots=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    req_to_token = torch.randperm(slots, generator=g)[: pool_rows * pool_len].view(pool_rows, pool_len)
    req_to_token = req_to_token.to(torch.int32)
    req_pool_indices = torch.tensor([5, 1, 3][:bsz], dtype=torch.int64)
    return req_to_token, req_pool_indices


def _ref_attention(q, keys, values, sm_scale, causal_offset=None):
    """q [Q, H, D], keys [S, Hkv, D], values [S, Hkv, Dv]; query i sees keys j <= causal_offset + i."""
    h, hkv = q.shape[1], keys.shape[1]
    out = torch.empty(q.shape[0], h, values.shape[-1])
    for i in range(q.shape[0]):
        for head in range(h):
            kv = head // (h // hkv)
            s = (keys[:, kv] @ q[i, head]) * sm_scale
            if causal_offset is not None:
                s[causal_offset + i + 1:] = float("-inf")
            out[i, head] = torch.softmax(s, 0) @ values[:, kv]
    return out


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 1)])
def test_decode_attention_writes_new_kv_and_attends_the_whole_sequence(heads, kv_heads):
    req_to_token, rpi = _pool()
    seq_lens = torch.tensor([5, 9, 1])
    d, dv, slots = 8, 6, 256
    k_buf, v_buf = torch.randn(slots, kv_heads, d), torch.randn(slots, kv_heads, dv)
    q = torch.randn(3, heads, d)
    k_new, v_new = torch.randn(3, kv_heads, d), torch.randn(3, kv_heads, dv)
    loc = torch.stack([req_to_token[rpi[i], seq_lens[i] - 1] for i in range(3)]).long()
    out = torch.empty(3, heads, dv)
    expect_k, expect_v = k_buf.clone(), v_buf.clone()
    expect_k[loc], expect_v[loc] = k_new, v_new
    ops.decode_attention_cpu(q, k_buf, v_buf, 1.0, 1.0, out, k_new, v_new, loc, torch.empty(0), req_to_token,
                             rpi, seq_lens, 0.3, 0.0, False, 0, None, None)
    assert torch.equal(k_buf, expect_k) and torch.equal(v_buf, expect_v)
    for i in range(3):
        idx = req_to_token[rpi[i], : seq_lens[i]].long()
        ref = _ref_attention(q[i:i + 1], expect_k[idx], expect_v[idx], 0.3)
        torch.testing.assert_close(out[i], ref[0], atol=1e-5, rtol=1e-5)


def test_decode_attention_logit_cap_and_refusals():
    req_to_token, rpi = _pool(bsz=1)
    k_buf, v_buf = torch.randn(256, 1, 4), torch.randn(256, 1, 4)
    q = torch.randn(1, 2, 4) * 10
    out = torch.empty(1, 2, 4)
    seq = torch.tensor([6])
    ops.decode_attention_cpu(q, k_buf, v_buf, 1.0, 1.0, out, None, None, torch.zeros(1, dtype=torch.long),
                             torch.empty(0), req_to_token, rpi, seq, 1.0, 5.0, False, 0, None, None)
    idx = req_to_token[rpi[0], :6].long()
    s = torch.einsum("hd,sd->hs", q[0], k_buf[idx, 0])
    ref = torch.softmax(5.0 * torch.tanh(s / 5.0), -1) @ v_buf[idx, 0]
    torch.testing.assert_close(out[0], ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(NotImplementedError, match="sliding window"):
        ops.decode_attention_cpu(q, k_buf, v_buf, 1.0, 1.0, out, None, None, torch.zeros(1, dtype=torch.long),
                                 torch.empty(0), req_to_token, rpi, seq, 1.0, 0.0, False, 17, None, None)


def _extend_case(kv_heads=2, heads=4, d=8, dv=8):
    req_to_token, rpi = _pool()
    prefix = torch.tensor([4, 0, 7])
    ext = torch.tensor([3, 5, 4])
    seq = prefix + ext
    starts = torch.cumsum(ext, 0) - ext
    total = int(ext.sum())
    k_buf, v_buf = torch.randn(256, kv_heads, d), torch.randn(256, kv_heads, dv)
    q = torch.randn(total, heads, d)
    k_ext, v_ext = torch.randn(total, kv_heads, d), torch.randn(total, kv_heads, dv)
    # as forward_extend does: the new K/V are stored at their slots before the op runs
    for i in range(3):
        slots = req_to_token[rpi[i], prefix[i]: seq[i]].long()
        k_buf[slots] = k_ext[starts[i]: starts[i] + ext[i]]
        v_buf[slots] = v_ext[starts[i]: starts[i] + ext[i]]
    return req_to_token, rpi, prefix, ext, seq, starts, k_buf, v_buf, q, k_ext, v_ext


def test_extend_attention_causal_over_prefix_and_new_tokens():
    req_to_token, rpi, prefix, ext, seq, starts, k_buf, v_buf, q, k_ext, v_ext = _extend_case()
    out = torch.zeros(q.shape[0], 4, 8)
    ops.extend_attention_cpu(q, k_ext, v_ext, out, k_buf, v_buf, 1.0, 1.0, req_to_token, rpi, seq, ext,
                             starts, int(ext.max()), 0.25, 0.0, False, 0, None, None, None, True)
    for i in range(3):
        idx = req_to_token[rpi[i], : seq[i]].long()
        ref = _ref_attention(q[starts[i]: starts[i] + ext[i]], k_buf[idx], v_buf[idx], 0.25, int(prefix[i]))
        torch.testing.assert_close(out[starts[i]: starts[i] + ext[i]], ref, atol=1e-5, rtol=1e-5)


def test_extend_attention_custom_mask_and_non_causal():
    req_to_token, rpi, prefix, ext, seq, starts, k_buf, v_buf, q, k_ext, v_ext = _extend_case()
    g = torch.Generator().manual_seed(3)
    masks = [torch.rand(int(ext[i]), int(seq[i]), generator=g) > 0.4 for i in range(3)]
    for m in masks:
        m[:, 0] = True                                  # every query sees something
    flat = torch.cat([m.reshape(-1) for m in masks])
    out = torch.zeros(q.shape[0], 4, 8)
    ops.extend_attention_cpu(q, k_ext, v_ext, out, k_buf, v_buf, 1.0, 1.0, req_to_token, rpi, seq, ext,
                             starts, int(ext.max()), 0.25, 0.0, False, 0, None, None, flat, True)
    out_nc = torch.zeros_like(out)
    ops.extend_attention_cpu(q, k_ext, v_ext, out_nc, k_buf, v_buf, 1.0, 1.0, req_to_token, rpi, seq, ext,
                             starts, int(ext.max()), 0.25, 0.0, False, 0, None, None, None, False)
    for i in range(3):
        idx = req_to_token[rpi[i], : seq[i]].long()
        for j in range(int(ext[i])):
            row = starts[i] + j
            for head in range(4):
                s = k_buf[idx][:, head // 2] @ q[row, head] * 0.25
                ref_nc = torch.softmax(s, 0) @ v_buf[idx][:, head // 2]
                ref = torch.softmax(s.masked_fill(~masks[i][j], float("-inf")), 0) @ v_buf[idx][:, head // 2]
                torch.testing.assert_close(out[row, head], ref, atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(out_nc[row, head], ref_nc, atol=1e-5, rtol=1e-5)


def test_extend_attention_mla_style_prefill_takes_per_head_keys():
    """DeepSeek's MHA prefill (no prefix) passes per-head K/V while the cache holds the latent."""
    req_to_token, rpi = _pool(bsz=2)
    ext = torch.tensor([4, 3])
    seq, starts = ext.clone(), torch.tensor([0, 4])
    q, k, v = torch.randn(7, 4, 12), torch.randn(7, 4, 12), torch.randn(7, 4, 8)
    latent = torch.randn(256, 1, 20)
    out = torch.zeros(7, 4, 8)
    ops.extend_attention_cpu(q, k, v, out, latent, latent[..., :16], 1.0, 1.0, req_to_token, rpi, seq, ext,
                             starts, 4, 0.5, 0.0, False, 0, None, None, None, True)
    for i in range(2):
        sl = slice(int(starts[i]), int(starts[i] + ext[i]))
        torch.testing.assert_close(out[sl], _ref_attention(q[sl], k[sl], v[sl], 0.5, 0), atol=1e-5, rtol=1e-5)


def test_build_draft_decode_metadata_rows_per_candidate():
    req_to_token, rpi = _pool()
    seq = torch.tensor([3, 6, 2])
    topk, steps, pool_len = 2, 3, 32
    out = ops.build_draft_decode_metadata_cpu(req_to_token, rpi, seq, topk, steps, pool_len)
    assert out.shape == (6, pool_len) and out.dtype == req_to_token.dtype
    for i in range(3):
        row = req_to_token[rpi[i]]
        for c in range(topk):
            got = out[i * topk + c]
            s = int(seq[i])
            assert torch.equal(got[:s], row[:s])
            for step in range(steps):
                assert got[s + step] == row[s + c * steps + step]
            assert not got[s + steps:].any()


def test_slot_copies_between_pool_and_packed_locs():
    req_to_token, rpi = _pool()
    start, end = torch.tensor([2, 0, 5]), torch.tensor([5, 4, 5])
    packed = torch.arange(100, 107)
    pool = req_to_token.clone()
    ops.assign_req_to_token_pool_cpu(rpi, pool, start, end, packed, 32)
    expect = req_to_token.clone()
    k = 0
    for i in range(3):
        for col in range(int(start[i]), int(end[i])):
            expect[rpi[i], col] = packed[k]
            k += 1
    assert torch.equal(pool, expect)
    back = torch.full((7,), -1, dtype=torch.int64)
    ops.assign_extend_cache_locs_cpu(rpi, pool, start, end, back, 32)
    assert torch.equal(back, packed)


def test_assign_draft_cache_locs_contiguous():
    req_to_token, rpi = _pool()
    seq = torch.tensor([3, 0, 10])
    out = torch.empty(3 * 2 * 3, dtype=torch.int64)
    ops.assign_draft_cache_locs_contiguous_cpu(rpi, req_to_token, seq, out, 32, 2, 3)
    expect = torch.cat([req_to_token[rpi[i], seq[i]: seq[i] + 6] for i in range(3)]).long()
    assert torch.equal(out, expect)


def test_fill_bonus_tokens_and_accept_out_cache_loc():
    tokens = torch.arange(12).view(3, 4) * 10
    lens = torch.tensor([1, 4, 2])
    bonus = torch.empty(3, dtype=torch.int64)
    ops.fill_bonus_tokens_cpu(tokens, lens, bonus, 4)
    assert bonus.tolist() == [tokens[0, 0], tokens[1, 3], tokens[2, 1]]
    accept_index = torch.tensor([[0, 2, -1], [3, -1, -1], [6, 7, 8]])
    out_cache_loc = torch.arange(9) + 50
    got = torch.full((9,), -7, dtype=torch.int64)
    ops.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, got)
    assert got[:6].tolist() == [50, 52, 53, 56, 57, 58] and got[6:].tolist() == [-7] * 3


def test_copy_all_layer_kv_cache_moves_rows_of_every_buffer():
    bufs = [torch.randn(16, 2, 3), torch.randn(16, 5), torch.randn(16, 1, 7).to(torch.bfloat16)]
    before = [b.clone() for b in bufs]
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.dtype.itemsize for b in bufs])
    src, tgt = torch.tensor([9, 10, 15]), torch.tensor([1, 2, 3])
    ops.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for b, old in zip(bufs, before):
        expect = old.clone()
        expect[tgt] = old[src]
        assert torch.equal(b, expect)


# --------------------------------------------------------------------------- the draft tree


def _ref_build_tree(parent_list, selected, seq_lens, topk, depth, n, mode):
    """The Triton twin's loops, one request at a time."""
    bsz = seq_lens.numel()
    seq = seq_lens.tolist()
    total = sum((s + n) * n for s in seq) if mode == ops.FULL_MASK else bsz * n * n
    mask = torch.ones(total, dtype=torch.bool)
    pos = torch.zeros(bsz * n, dtype=torch.long)
    r_index = torch.zeros(bsz, n, dtype=torch.long)
    nxt = torch.full((bsz, n), -1, dtype=torch.long)
    sib = torch.full((bsz, n), -1, dtype=torch.long)
    prefix = 0
    for b in range(bsz):
        sl = seq[b]
        seq_tree = n * n * b + prefix * n
        prefix += sl
        pos[b * n] = sl
        for i in range(n - 1, 0, -1):
            r_index[b, i] = b * n + i
            ptb = int(selected[b, i - 1]) // topk
            ppos, found = 0, ptb == 0
            if not found:
                ptok = int(parent_list[b, ptb])
                for pp in range(n - 1):
                    if int(selected[b, pp]) == ptok:
                        ppos, found = pp + 1, True
                        break
            if found:
                prev = int(nxt[b, ppos])
                nxt[b, ppos] = i
                if prev != -1:
                    sib[b, i] = prev
        r_index[b, 0] = b * n
        for x in range(n):
            tti = (seq_tree + (sl + n) * x + sl + 1) if mode == ops.FULL_MASK else (n * n * b + n * x + 1)
            mask[tti - 1] = True
            mask[tti: tti + n - 1] = False
            if x > 0:
                cur, position = x - 1, 0
                for _ in range(depth):
                    position += 1
                    mask[tti + cur] = True
                    ptb = int(selected[b, cur]) // topk
                    if ptb == 0:
                        break
                    ptok = int(parent_list[b, ptb])
                    nxt_cur = [cp for cp in range(n - 1) if int(selected[b, cp]) == ptok]
                    if not nxt_cur:
                        break
                    cur = nxt_cur[0]
                pos[b * n + x] = position + sl
    return mask, pos, r_index, nxt, sib


def _tree_inputs(bsz, topk, depth, n, seed):
    """Candidates shaped as EAGLE's draft loop leaves them: step 0 scores sit at [0, topk), step s >= 1 at
    topk + (s-1)*topk^2 onwards; parent_list[1 + (s-1)*topk:...] are the positions expanded at step s-1;
    selected is a sorted subset of all positions (parents not selected make the kernel stop a chain)."""
    g = torch.Generator().manual_seed(seed)
    total = topk + (depth - 1) * topk * topk
    parent_list = torch.full((bsz, topk * (depth - 1) + 1), -1, dtype=torch.long)
    selected = torch.zeros(bsz, n - 1, dtype=torch.long)
    for b in range(bsz):
        for s in range(1, depth):
            lo = 0 if s == 1 else topk + (s - 2) * topk * topk
            width = topk if s == 1 else topk * topk
            pick = lo + torch.randperm(width, generator=g)[:topk]
            parent_list[b, 1 + (s - 1) * topk: 1 + s * topk] = pick
        selected[b] = torch.randperm(total, generator=g)[: n - 1].sort().values
    return parent_list, selected


@pytest.mark.parametrize("topk,depth,n,mode", [(1, 3, 4, ops.FULL_MASK), (1, 3, 4, ops.QLEN_ONLY),
                                                (2, 3, 6, ops.FULL_MASK), (3, 4, 8, ops.QLEN_ONLY)])
def test_build_tree_kernel_efficient_matches_the_triton_loops(topk, depth, n, mode):
    bsz = 3
    if topk == 1:     # a chain: EAGLE's topk-1 selection is 0, 1, ..., n-2 with parents 0..depth-1
        parent_list = torch.arange(depth).repeat(bsz, 1)
        selected = torch.arange(n - 1).repeat(bsz, 1)
    else:
        parent_list, selected = _tree_inputs(bsz, topk, depth, n, seed=n)
    seq = torch.tensor([5, 2, 9])
    ref_mask, ref_pos, ref_ri, ref_nxt, ref_sib = _ref_build_tree(parent_list, selected, seq, topk, depth, n,
                                                                  mode)
    mask = torch.ones_like(ref_mask)
    pos = torch.zeros(bsz * n, dtype=torch.long)
    ri = torch.zeros(bsz, n, dtype=torch.long)
    nxt = torch.full((bsz, n), -1, dtype=torch.long)
    sib = torch.full((bsz, n), -1, dtype=torch.long)
    ops.build_tree_kernel_efficient_cpu(parent_list, selected, seq, mask, pos, ri, nxt, sib, topk, depth, n,
                                        mode)
    assert torch.equal(ri, ref_ri) and torch.equal(nxt, ref_nxt) and torch.equal(sib, ref_sib)
    assert torch.equal(pos, ref_pos)
    assert torch.equal(mask, ref_mask)


def _ref_verify(candidates, r_index, nxt, sib, target, steps):
    bsz, n = candidates.shape
    predicts = torch.zeros(bsz * n, dtype=torch.long)
    accept_index = torch.full((bsz, steps), -1, dtype=torch.long)
    accept_num = torch.zeros(bsz, dtype=torch.long)
    flat = target.reshape(-1)
    for b in range(bsz):
        last = int(r_index[b, 0])
        accept_index[b, 0] = last
        num, cur = 0, 0
        for _ in range(1, steps):
            cur = int(nxt[b, cur])
            want = int(flat[last])
            matched = False
            while cur != -1:
                if int(candidates[b, cur]) == want:
                    predicts[last] = want
                    num += 1
                    accept_index[b, num] = int(r_index[b, cur])
                    last = int(r_index[b, cur])
                    matched = True
                    break
                cur = int(sib[b, cur])
            if not matched:
                break
        accept_num[b] = num
        predicts[last] = flat[last]
    return predicts, accept_index, accept_num


@pytest.mark.parametrize("topk,depth,n", [(1, 3, 4), (2, 3, 6), (3, 4, 8)])
def test_verify_tree_greedy_matches_the_triton_loops(topk, depth, n):
    bsz = 4
    if topk == 1:
        parent_list, selected = torch.arange(depth).repeat(bsz, 1), torch.arange(n - 1).repeat(bsz, 1)
    else:
        parent_list, selected = _tree_inputs(bsz, topk, depth, n, seed=n + 1)
    seq = torch.tensor([4, 4, 7, 1])
    ri = torch.zeros(bsz, n, dtype=torch.long)
    nxt = torch.full((bsz, n), -1, dtype=torch.long)
    sib = torch.full((bsz, n), -1, dtype=torch.long)
    ops.build_tree_kernel_efficient_cpu(parent_list, selected, seq, torch.ones(bsz * n * n, dtype=torch.bool),
                                        torch.zeros(bsz * n, dtype=torch.long), ri, nxt, sib, topk, depth, n,
                                        ops.QLEN_ONLY)
    g = torch.Generator().manual_seed(7)
    for trial in range(6):
        candidates = torch.randint(0, 3, (bsz, n), generator=g)
        target = torch.randint(0, 3, (bsz, n), generator=g)
        if trial == 0:       # the whole chain accepted where possible
            target = torch.roll(candidates, -1, 1)
        steps = depth + 1
        ref = _ref_verify(candidates, ri, nxt, sib, target, steps)
        predicts = torch.zeros(bsz * n, dtype=torch.long)
        accept_index = torch.full((bsz, steps), -1, dtype=torch.long)
        accept_num = torch.zeros(bsz, dtype=torch.long)
        ops.verify_tree_greedy_cpu(predicts, accept_index, accept_num, candidates, ri, nxt, sib, target)
        assert torch.equal(accept_num, ref[2]) and torch.equal(accept_index, ref[1])
        assert torch.equal(predicts, ref[0])


# --------------------------------------------------------------------------- the stand-in package


def test_standin_package_registers_the_attention_ops_and_names_the_missing_ones(monkeypatch):
    monkeypatch.syspath_prepend(str(SITE))
    sys.modules.pop("sgl_kernel", None)
    sgl_kernel = importlib.import_module("sgl_kernel")
    assert sgl_kernel.fill_bonus_tokens_cpu is ops.fill_bonus_tokens_cpu
    with pytest.raises(NotImplementedError, match="sgl_kernel.fused_experts_cpu"):
        sgl_kernel.fused_experts_cpu(1, 2)
    from sgl_kernel.mamba import causal_conv1d_fn_cpu
    with pytest.raises(NotImplementedError, match="sgl_kernel.mamba.causal_conv1d_fn_cpu"):
        causal_conv1d_fn_cpu()
    req_to_token, rpi = _pool(bsz=1)
    k_buf, v_buf = torch.randn(256, 1, 4), torch.randn(256, 1, 4)
    q, out = torch.randn(1, 2, 4), torch.empty(1, 2, 4)
    torch.ops.sgl_kernel.decode_attention_cpu(q, k_buf, v_buf, 1.0, 1.0, out, None, None,
                                              torch.zeros(1, dtype=torch.long), torch.empty(0), req_to_token,
                                              rpi, torch.tensor([3]), 1.0, 0.0, False, 0, None, None)
    idx = req_to_token[rpi[0], :3].long()
    ref = torch.softmax(torch.einsum("hd,sd->hs", q[0], k_buf[idx, 0]), -1) @ v_buf[idx, 0]
    torch.testing.assert_close(out[0], ref, atol=1e-5, rtol=1e-5)
    sys.modules.pop("sgl_kernel", None)
    sys.modules.pop("sgl_kernel.mamba", None)


def test_accommodations_refuse_another_release_in_one_line():
    check_release("0.5.23")
    with pytest.raises(UnsupportedRelease) as exc:
        check_release("0.5.9")
    msg = str(exc.value)
    assert "0.5.23" in msg and "0.5.9" in msg and "\n" not in msg


def test_only_model_modules_naming_the_launch_architectures_are_imported(tmp_path):
    from helpers.engines.sglang.cpu import registry_note, unneeded_model_modules
    models = tmp_path / "lib" / "python3.11" / "site-packages" / "sglang" / "srt" / "models"
    models.mkdir(parents=True)
    (models / "__init__.py").write_text("")
    (models / "deepseek_v2.py").write_text("class DeepseekV3ForCausalLM: ...\n"
                                           "EntryClass = [DeepseekV3ForCausalLM]\n")
    (models / "llama_eagle3.py").write_text("EntryClass = [LlamaForCausalLMEagle3]\n")
    (models / "deepseek_nextn.py").write_text("EntryClass = [DeepseekV3ForCausalLMNextN]\n")
    (models / "qwen2.py").write_text("class Qwen2ForCausalLM: ...\nEntryClass = Qwen2ForCausalLM\n")
    (models / "deepseek_v2_like.py").write_text("class DeepseekV3ForCausalLMish: ...\n")   # a longer name
    skipped, kept = unneeded_model_modules(tmp_path, {"DeepseekV3ForCausalLM", "LlamaForCausalLMEagle3"})
    assert skipped == ["deepseek_v2_like", "qwen2"]
    assert kept == ["deepseek_nextn", "deepseek_v2", "llama_eagle3"]
    assert "2 of 5 model modules not imported" in registry_note(skipped, kept)["what"]
    # no sglang in the folder, or nothing to keep by: nothing is skipped
    assert unneeded_model_modules(tmp_path / "elsewhere", {"X"}) == ([], [])
    assert unneeded_model_modules(tmp_path, set()) == ([], [])
