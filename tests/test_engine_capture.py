"""Capture through a serving engine, against a fake SGLang that answers as the real one does:
``meta_info.hidden_states`` = [prefill rows (prompt_len x kH), one row per generated token]."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from _pairs import tiny_default, tiny_dump
from conftest import scaled, unavailable

REPO = Path(__file__).resolve().parent.parent
SERVED = (3, 7, 10)      # what SGLang 0.5.9 captures for ids [2, 6, 9] on the tiny DeepSeek target


@pytest.fixture(scope="module")
def fake_sglang():
    from helpers.model.capture import run_and_capture
    from helpers.model.target import load_target

    target, _ = load_target(tiny_default() / "target")
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            if not body.get("return_hidden_states"):
                self.send_response(400)
                self.end_headers()
                return
            ids = torch.tensor([body["input_ids"]])
            out, store = run_and_capture(target, ids, SERVED, use_cache=False)
            prefill = torch.cat([store[b][0] for b in SERVED], -1)          # [T, 3H], ascending capture order
            nxt = int(out.logits[0, -1].argmax())
            _, store2 = run_and_capture(target, torch.tensor([body["input_ids"] + [nxt]]), SERVED,
                                        use_cache=False)
            gen = torch.cat([store2[b][0, -1] for b in SERVED], -1)
            payload = {"text": "", "meta_info": {"prompt_tokens": ids.shape[1], "completion_tokens": 1,
                                                 "hidden_states": [prefill.tolist(), gen.tolist()]}}
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()


def test_rows_from_response_shapes():
    from helpers.engines.sglang.capture import CaptureError, rows_from_response

    body = {"meta_info": {"hidden_states": [[[1.0, 2.0], [3.0, 4.0]], [5.0, 6.0]]}}
    assert rows_from_response(body, 2).tolist() == [[1.0, 2.0], [3.0, 4.0]]
    with pytest.raises(CaptureError, match="no meta_info.hidden_states"):
        rows_from_response({"meta_info": {}}, 2)
    with pytest.raises(CaptureError, match="3 prompt tokens"):
        rows_from_response({"meta_info": {"hidden_states": [[[1.0]]]}}, 3)


def test_capture_measures_the_served_wiring(tmp_path, fake_sglang):
    url, seen = fake_sglang
    base = tiny_default()
    out = tmp_path / "captured"
    r = subprocess.run([sys.executable, "-m", "helpers", "capture", "--engine-url", url, "--tokenizer",
                        str(base / "target"), "--text", str(base / "heldout.txt"), "--out", str(out),
                        "--window", "128", "--records", "3", "--layer-ids", "2,6,9", "--reference",
                        str(tiny_dump("speculators-legacy"))],
                       cwd=REPO, capture_output=True, text=True, timeout=scaled(600))
    assert r.returncode == 0, r.stderr
    assert (seen and seen[0]["return_hidden_states"] is True
            and seen[0]["sampling_params"]["max_new_tokens"] == 1)
    assert sorted(p.name for p in out.iterdir()) == ["capture.json", "hs_0.safetensors", "hs_1.safetensors",
                                                     "hs_2.safetensors"]
    measured = json.loads(r.stdout[r.stdout.index("{"):])["served_slots_measured"]
    assert [m["boundary"] for m in measured] == list(SERVED)        # measured, not inferred
    # and diagnose reads the capture like any dump: the running tiny target names each slot
    d = subprocess.run([sys.executable, "-m", "helpers", "diagnose", "--draft", str(base / "draft"), "--data",
                        str(out), "--target", str(base / "target"), "--engine", "sglang==0.5.9", "--json"],
                       cwd=REPO, capture_output=True,
                       text=True, timeout=scaled(600))
    res = json.loads(d.stdout)
    assert d.returncode == res["exit_code"], d.stderr          # the verdict's code: served is not trained
    assert res["slot_boundaries"] == list(SERVED) and res["served_slots"] == [0, 1, 2]
    assert res["trained_slots"] is None and res["data_format"] == "speculators"


def test_capture_refuses_an_engine_without_hidden_states(tmp_path):
    from helpers.engines.sglang.capture import CaptureError, capture_dump

    def post(url, payload):
        return {"text": "x", "meta_info": {"completion_tokens": 1}}

    with pytest.raises(CaptureError, match="enable-return-aux-hidden-states"):
        capture_dump("http://127.0.0.1:1", torch.arange(32).view(2, 16), 64, tmp_path / "out", post=post)
    assert not (tmp_path / "out").exists() and not any(tmp_path.iterdir())


def _cli(capsys, *argv) -> tuple[int, str]:
    from helpers.commands.capture import main
    try:
        code = main(list(argv))
    except SystemExit as exc:       # argparse's refusals, as `python -m helpers` ends with them
        code = exc.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), lines
    return code, lines[0]


@pytest.mark.parametrize("extra, expected", [
    ((), "give --backend sglang|vllm --target DIR --draft DIR"),
    (("--backend", "sglang", "--target", "T"), "--backend sglang needs --draft DIR"),
    (("--backend", "sglang", "--target", "T", "--draft", "D", "--layer-ids", "0,3,7"),
     "captures the ids the engine reads from --draft"),
    (("--backend", "sglang", "--draft", "D"), "--backend sglang needs --target DIR"),
    (("--backend", "sglang", "--target", "T", "--draft", "D", "--reference", "R"),
     "--reference belong to --engine-url"),
    (("--engine-url", "http://127.0.0.1:1", "--tokenizer", "T", "--engine", "sglang==0.5.9"),
     "--engine start an engine (--backend)"),
    (("--engine-url", "http://127.0.0.1:1", "--backend", "vllm"), "--backend vllm starts vLLM itself"),
    (("--engine-url", "http://127.0.0.1:1"), "--engine-url needs --tokenizer"),
])
def test_capture_options_refused_before_any_engine(extra, expected, tmp_path, capsys):
    """Which way in is decided from the parsed options (no argv sniffing); a wrong mix is one line and
    exit 2 before an engine starts or a folder is made."""
    heldout = tiny_default() / "heldout.txt"
    capsys.readouterr()            # the pair's first build (its progress bars) is not the command's output
    code, line = _cli(capsys, "--text", str(heldout), "--out", str(tmp_path / "cap"), *extra)
    assert code == 2 and expected in line, line
    assert not any(tmp_path.iterdir())


def test_fc_rows_waits_for_this_windows_input():
    """The fc probe keeps the latest input per row count: a stale one (the last window's) is waited past,
    a repeated window's equal input is taken, and none at all is one CaptureError naming the log."""
    from helpers.engines.sglang.capture import CaptureError, _fc_rows

    class Engine:
        log_path = "LOG"

        def __init__(self, frames):
            self.frames, self.sent = list(frames), []

        def generate(self, prompts, max_tokens):
            self.sent.append((prompts, max_tokens))

        def fc_inputs(self):
            return self.frames.pop(0) if len(self.frames) > 1 else self.frames[0]

    old, new = torch.zeros(8, 6), torch.ones(8, 6)
    e = Engine([{8: old}, {8: old}, {8: new}])
    assert torch.equal(_fc_rows(e, list(range(8)), old, False, 5.0, "window 1"), new)
    assert e.sent == [([list(range(8))], 1)]
    assert torch.equal(_fc_rows(Engine([{8: old}]), list(range(8)), old, True, 5.0, "window 1"), old)
    with pytest.raises(CaptureError, match=r"window 0: the draft.s fc received no 8-row input .*LOG"):
        _fc_rows(Engine([{}]), list(range(8)), None, False, 0.2, "window 0")


def test_capture_backend_refuses_another_engines_rules(tmp_path, capsys):
    """``--backend sglang --engine vllm==...``: the runtime cannot run those rules; one line, no engine."""
    from helpers.engines.sglang.install import EngineUnavailable, find_sglang
    try:
        find_sglang()
    except EngineUnavailable:
        unavailable("no .venv-sglang: the refusal needs the runtime it names")
    code, line = _cli(capsys, "--backend", "sglang", "--engine", "vllm==0.32.0", "--target", "T", "--draft",
                      "D", "--text", str(tiny_default() / "heldout.txt"), "--out", str(tmp_path / "cap"))
    assert code == 2 and "--engine vllm==0.32.0 names another engine's rules" in line, line
    assert not any(tmp_path.iterdir())
