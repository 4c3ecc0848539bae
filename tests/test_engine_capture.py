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
from conftest import scaled

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
    from helpers.commands.capture import CaptureError, rows_from_response

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
    assert d.returncode == 0, d.stderr
    res = json.loads(d.stdout)
    assert res["slot_boundaries"] == list(SERVED) and res["served_slots"] == [0, 1, 2]
    assert res["trained_slots"] is None and res["data_format"] == "speculators"


def test_capture_refuses_an_engine_without_hidden_states(tmp_path):
    from helpers.commands.capture import CaptureError, capture_dump

    def post(url, payload):
        return {"text": "x", "meta_info": {"completion_tokens": 1}}

    with pytest.raises(CaptureError, match="enable-return-aux-hidden-states"):
        capture_dump("http://127.0.0.1:1", torch.arange(32).view(2, 16), 64, tmp_path / "out", post=post)
    assert not (tmp_path / "out").exists() and not any(tmp_path.iterdir())
