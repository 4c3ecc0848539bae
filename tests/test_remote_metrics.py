"""A dashboard on another host (helpers/investigation/exports.py ``fetch``, ``prometheus_readings``): any
http(s) host, a bearer token from EAGLE3_WORKBOOK_METRICS_TOKEN (never argv), one-line errors, and a
Prometheus server's query API (an instant query is one reading, a range query the window it holds). The
servers here are stand-ins on 127.0.0.1 serving the recorded vLLM exports (tests/exports/vllm)."""
from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from helpers.__main__ import main as cli
from helpers.investigation.exports import TOKEN_ENV, parse_prometheus, read_served

ROOT = Path(__file__).resolve().parent
VLLM = ROOT / "exports" / "vllm" / "deployed"
DRAFT = ROOT.parent / "data" / "tiny-kimi" / "draft"
TOKEN = "s3cret-token"


def _series(text: str) -> list[tuple[str, dict, str]]:
    """(name, labels, value) of each sample line of a scrape (what a Prometheus would store)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, value = line.rsplit(" ", 1)
        name, _, rest = head.partition("{")
        labels = dict(kv.split("=", 1) for kv in rest.rstrip("}").split(",") if kv) if rest else {}
        out.append((name, {k: v.strip('"') for k, v in labels.items()}, value))
    return out


class Stand(BaseHTTPRequestHandler):
    """/metrics: the recorded scrape, behind a bearer token; /api/v1/query(_range): the two recorded scrapes
    as a Prometheus would hold them (t=1000 and t=1300)."""

    def log_message(self, *a):
        pass

    def _send(self, code: int, body: str, kind="text/plain"):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self._send(401, "unauthorized")
        if url.path == "/metrics":
            return self._send(200, (VLLM / "metrics.txt").read_text())
        if url.path.startswith("/api/v1/query"):
            before = _series((VLLM / "metrics_before.txt").read_text())
            after = {(n, tuple(sorted(lab.items()))): v
                     for n, lab, v in _series((VLLM / "metrics.txt").read_text())}
            result = []
            for name, labels, v0 in before:
                v1 = after.get((name, tuple(sorted(labels.items()))))
                if v1 is None or not name.startswith("vllm:spec_decode"):
                    continue
                metric = {"__name__": name, **labels}
                if url.path.endswith("query_range") and "restart=1" in url.query:
                    # the engine restarted after t=1150 and by t=1300 had served half again as much as the
                    # window's traffic: the counter fell, then rose past where it was
                    part = float(v1) - float(v0)
                    result.append({"metric": metric, "values": [[1000, v0], [1150, repr(float(v1))],
                                                                [1300, repr(0.5 * part)]]})
                elif url.path.endswith("query_range"):
                    result.append({"metric": metric, "values": [[1000, v0], [1150, v0], [1300, v1]]})
                else:
                    result.append({"metric": metric, "value": [1300, v1]})
            kind = "matrix" if url.path.endswith("query_range") else "vector"
            return self._send(200, json.dumps({"status": "success", "data": {"resultType": kind,
                                                                               "result": result}}),
                              "application/json")
        return self._send(404, "no such path")


@pytest.fixture()
def stand_in():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stand)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_remote_metrics_needs_its_token_from_the_environment(stand_in, monkeypatch, capsys):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert cli(["diagnose", "--metrics", f"{stand_in}/metrics", "--draft", str(DRAFT)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "HTTP 401" in err and TOKEN_ENV in err
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    local = read_served([str(VLLM / "metrics.txt")])
    remote = read_served([f"{stand_in}/metrics"])
    assert (remote.engine, remote.drafts, remote.accepted_per_position) == \
        (local.engine, local.drafts, local.accepted_per_position)
    code = cli(["diagnose", "--metrics", f"{stand_in}/metrics", "--draft", str(DRAFT), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code in (0, 1, 3) and out["drafts"] == local.drafts


def test_a_prometheus_range_query_is_the_window_its_dashboard_holds(stand_in, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    files = read_served([str(VLLM / "metrics_before.txt"), str(VLLM / "metrics.txt")])
    query = urllib.parse.quote('{__name__=~"vllm:spec_decode.*"}')
    ranged = read_served([f"{stand_in}/api/v1/query_range?query={query}&start=1000&end=1300&step=150"])
    assert (ranged.drafts, ranged.accepted_per_position) == (files.drafts, files.accepted_per_position)
    assert any("window" in n for n in ranged.notes)
    # a restart between two of the dashboard's samples, then more traffic than before: counted the way
    # Prometheus's increase() counts (each fall a restart from 0), not as the difference of the two ends
    restarted = read_served([f"{stand_in}/api/v1/query_range?query={query}&start=1000&end=1300&step=150"
                             f"&restart=1"])
    assert restarted.reset and abs(restarted.drafts - 1.5 * files.drafts) <= 1     # the ends alone: 0.5x
    assert any("restarted inside the window (1 time(s)" in n and "increase()" in n for n in restarted.notes)
    instant = read_served([f"{stand_in}/api/v1/query?query={query}"])
    whole = read_served([str(VLLM / "metrics.txt")])
    assert (instant.drafts, instant.accepted_per_position) == (whole.drafts, whole.accepted_per_position)
    assert parse_prometheus((VLLM / "metrics.txt").read_text(), "x", None) is not None
