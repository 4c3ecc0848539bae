"""vLLM's hidden-state extraction connector, made to run on a CPU host (loaded by vLLM, in .venv-vllm).

speculators >= 0.5 writes its training dumps through vLLM: ``speculative_config={"method":
"extract_hidden_states"}`` caches the aux states a draft's ids name, and
``ExampleHiddenStatesConnector`` saves them per request as ``hidden_states [tokens, k, H]`` plus
``token_ids``. The stock connector copies through a CUDA stream into pinned memory and fails on a
CPU-only build (``pin_memory=True requires a CUDA or other accelerator backend``). This subclass
keeps everything else, the slot arithmetic included, and writes synchronously from host memory:
the states a CPU engine captured are already there. vLLM loads it by name through
``kv_transfer_config.kv_connector_module_path = "helpers.engines.vllm.connector"``.
"""
from __future__ import annotations

import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1 import example_hidden_states_connector as stock


class _Done:
    """Stands in for the CUDA event the stock ``get_finished`` polls: the write already happened."""

    @staticmethod
    def query() -> bool:
        return True


class CpuHiddenStatesConnector(stock.ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending) -> None:
        if not self._is_tp_rank_zero:
            return
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slots = (offsets[None, :] + blocks[:, None] * self._block_size).flatten()
        states = stock.extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0])
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        try:
            save_file({"hidden_states": states.contiguous().clone(), "token_ids": pending.token_ids.clone()},
                      pending.filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)
        self._req_copy_events[pending.req_id] = _Done()
