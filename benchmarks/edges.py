"""The workbook at its edges, as a hostile server, a proxy, an air-gapped host and a careless copy would meet
it: each case runs the real CLI in a subprocess and records its exit code, wall seconds and peak memory.

    .venv/bin/python benchmarks/edges.py [--repo PATH] [--limit 40]

``--repo`` is the checkout whose ``python -m helpers`` is run (default: this one), so the same script
measures any commit. Every server is started here on loopback (127.0.0.2 stands for another host); the
air-gapped cases run under ``unshare -rn`` (a network namespace with no interface up) with an empty cache.
A case that outlives ``--limit`` seconds is killed and reported as such.
"""
from __future__ import annotations

import argparse
import http.server
import os
import shutil
import signal
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
PAGE = ("# TYPE vllm:spec_decode_num_drafts_total counter\n"
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="/m/t"} 400.0\n'
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter\n"
        + "".join(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="/m/t",'
                  f'position="{i}"}} {a}.0\n' for i, a in enumerate((280, 200, 150))))
TOKEN = "s3cret-token-for-the-dashboard"


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def serve(host: str, handler) -> tuple[_Server, str]:
    srv = _Server((host, 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://{host}:{srv.server_address[1]}"


def handler(kind: str, seen: dict, where: str = ""):
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):  # noqa: N802
            seen.setdefault("auth", []).append(self.headers.get("Authorization"))
            if kind == "redirect":
                self.send_response(302)
                self.send_header("Location", where + "/metrics")
                self.end_headers()
                return
            if kind == "page":
                body = PAGE.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(200)
            self.end_headers()
            try:
                if kind == "slow":        # one byte a second, for ever
                    for ch in PAGE.encode() * 1000:
                        self.wfile.write(bytes([ch]))
                        self.wfile.flush()
                        time.sleep(1.0)
                elif kind == "endless":   # as fast as the socket takes it, for ever
                    chunk = b"# padding padding padding padding padding padding padding padding\n" * 1024
                    while True:
                        self.wfile.write(chunk)
            except OSError:
                pass
    return H


def run(repo: Path, args: list[str], env: dict, limit: float, offline: bool = False) -> dict:
    """``python -m helpers ARGS`` of ``repo``: exit code, seconds, the child's own peak RSS (wait4 on it)."""
    py = str(repo / ".venv" / "bin" / "python")
    cmd = [py, "-m", "helpers", *args]
    if offline:
        cmd = ["unshare", "-rn", *cmd]
    t0 = time.monotonic()
    errf, outf = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    p = subprocess.Popen(cmd, cwd=repo, env=env, stdout=outf, stderr=errf, start_new_session=True)
    killed = threading.Event()

    def kill():
        killed.set()
        os.killpg(p.pid, signal.SIGKILL)
    timer = threading.Timer(limit, kill)
    timer.start()
    _, status, usage = os.wait4(p.pid, 0)
    timer.cancel()
    secs = time.monotonic() - t0
    errf.seek(0)
    outf.seek(0)
    text = (errf.read().decode(errors="replace") + outf.read().decode(errors="replace")).strip().splitlines()
    rc = "killed" if killed.is_set() else os.waitstatus_to_exitcode(status)
    return {"rc": rc, "s": secs, "mb": usage.ru_maxrss / 1024, "first": text[0][:160] if text else ""}


DIAG = ["diagnose", "--draft", "data/tiny-kimi/draft", "--engine", "vllm==0.32.0", "--metrics"]


def cases(repo: Path, limit: float) -> list[tuple[str, dict]]:
    base = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    rows = []
    # 1. a redirect to another host must not carry the token there
    seen_b: dict = {}
    b, b_url = serve("127.0.0.2", handler("page", seen_b))
    a, a_url = serve("127.0.0.1", handler("redirect", {}, b_url))
    r = run(repo, [*DIAG, a_url + "/metrics"],
                    {**base, "EAGLE3_WORKBOOK_METRICS_TOKEN": TOKEN}, limit)
    r["note"] = f"127.0.0.2 received the token: {'yes' if any(seen_b.get('auth') or []) else 'no'}"
    rows.append(("redirect to another host, token set", r))
    a.shutdown()
    b.shutdown()
    # 2. one byte a second
    s, s_url = serve("127.0.0.1", handler("slow", {}))
    rows.append(("server sends 1 byte/s", run(repo, [*DIAG, s_url + "/metrics"],
                                                      base, limit)))
    s.shutdown()
    # 3. an endless body
    e, e_url = serve("127.0.0.1", handler("endless", {}))
    rows.append(("server streams an endless body", run(
        repo, [*DIAG, e_url + "/metrics"], base, limit)))
    e.shutdown()
    # 4. a proxy set, no no_proxy: loopback must not go through it; another host names the proxy
    g, g_url = serve("127.0.0.1", handler("page", {}))
    dead = "http://127.0.0.1:9"
    rows.append(("http_proxy set (dead), /metrics on loopback", run(
        repo, [*DIAG, g_url + "/metrics"], {**base, "http_proxy": dead, "HTTP_PROXY": dead},
        limit)))
    rows.append(("http_proxy set (dead), /metrics on another host", run(
        repo, [*DIAG, "http://metrics.example.invalid:9090/metrics"],
        {**base, "http_proxy": dead, "HTTP_PROXY": dead}, limit)))
    g.shutdown()
    # 5. air-gapped, empty cache: every engine
    with tempfile.TemporaryDirectory() as cache:
        env = {**base, "EAGLE3_WORKBOOK_CACHE": cache, "PIP_NO_CACHE_DIR": "1"}
        for eng in ("sglang==0.5.23", "vllm==0.32.0", "llamacpp==b11434", "trtllm", "lmdeploy==0.18.0"):
            rows.append((f"no network, empty cache: check --engine {eng}", run(
                repo, ["check", "--target", "data/tiny-kimi/target", "--draft", "data/tiny-kimi/draft",
                       "--engine", eng], env, limit, offline=True)))
    # 6. a half-copied checkpoint
    with tempfile.TemporaryDirectory() as tmp:
        draft = Path(tmp) / "draft"
        shutil.copytree(repo / "data" / "tiny-kimi" / "draft", draft)
        st = draft / "model.safetensors"
        with st.open("r+b") as f:
            f.truncate(st.stat().st_size // 2)
        rows.append(("model.safetensors cut in half", run(
            repo, ["check", "--target", "data/tiny-kimi/target", "--draft", str(draft),
                   "--engine", "vllm==0.32.0"], base, limit)))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=HERE)
    ap.add_argument("--limit", type=float, default=40.0)
    ns = ap.parse_args()
    print("| edge | exit | seconds | peak MB | first line |\n|---|---|---|---|---|")
    for name, r in cases(ns.repo.resolve(), ns.limit):
        first = (r["first"] + (f" ({r['note']})" if r.get("note") else "")).replace("|", "/")
        print(f"| {name} | {r['rc']} | {r['s']:.1f} | {r['mb']:.0f} | {first} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
