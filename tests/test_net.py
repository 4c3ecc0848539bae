"""The one HTTP client (helpers/net.py) against hostile servers, proxies and redirects, all on loopback
(127.0.0.2 stands for another host): deadlines hold, bodies are capped, a credential reaches only the
origin it was given for, loopback never goes through a proxy, and a failing proxy is named."""
from __future__ import annotations

import http.server
import socketserver
import threading
import time

import pytest

from helpers import net
from helpers.errors import BadOption
from helpers.investigation import exports


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture
def serve():
    started = []

    def start(host: str, do_get) -> str:
        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):  # noqa: N802
                try:
                    do_get(self)
                except OSError:
                    pass
        srv = _Server((host, 0), H)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        started.append(srv)
        return f"http://{host}:{srv.server_address[1]}"
    yield start
    for srv in started:
        srv.shutdown()
        srv.server_close()


def reply(h, code: int = 200, body: bytes = b"ok", headers: dict | None = None):
    h.send_response(code)
    for k, v in (headers or {}).items():
        h.send_header(k, v)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def endless(h):
    """A body that never ends, as fast as the socket takes it."""
    h.send_response(200)
    h.end_headers()
    while True:
        h.wfile.write(b"# pad\n" * 4096)


@pytest.fixture
def no_proxy_env(monkeypatch):
    for v in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
              "NO_PROXY"):
        monkeypatch.delenv(v, raising=False)
    return monkeypatch


def test_a_redirect_to_another_host_goes_without_the_token(serve, no_proxy_env):
    seen = {}

    def other(h):
        seen["other"] = h.headers.get("Authorization")
        reply(h, body=b"elsewhere")
    b = serve("127.0.0.2", other)

    def first(h):
        if h.path == "/here":                          # a redirect on the same origin keeps the token
            seen["same"] = h.headers.get("Authorization")
            h.send_response(302)
            h.send_header("Location", b + "/metrics")
            h.end_headers()
            return
        seen["first"] = h.headers.get("Authorization")
        h.send_response(302)
        h.send_header("Location", "/here")
        h.end_headers()
    a = serve("127.0.0.1", first)
    r = net.get(a + "/metrics", deadline_s=5, max_bytes=1024, auth="Bearer s3cret")
    assert r.text() == "elsewhere" and r.url.startswith(b)
    assert seen == {"first": "Bearer s3cret", "same": "Bearer s3cret", "other": None}


def test_the_metrics_token_is_never_sent_to_a_host_the_user_did_not_name(serve, no_proxy_env):
    seen = []
    b = serve("127.0.0.2", lambda h: (seen.append(h.headers.get("Authorization")), reply(h, body=b"x 1\n")))
    a = serve("127.0.0.1",
              lambda h: (h.send_response(301), h.send_header("Location", b + "/m"), h.end_headers()))
    no_proxy_env.setenv(exports.TOKEN_ENV, "s3cret")
    assert exports.fetch(a + "/metrics", timeout=5) == "x 1\n"
    assert seen == [None]


def test_credentials_in_an_index_url_go_to_that_origin_only(serve, no_proxy_env):
    seen = {}

    def other(h):
        seen["other"] = h.headers.get("Authorization")
        reply(h)
    b = serve("127.0.0.2", other)

    def index(h):
        seen["index"] = h.headers.get("Authorization")
        h.send_response(302)
        h.send_header("Location", b + "/files/x.whl")
        h.end_headers()
    a = serve("127.0.0.1", index)
    url = a.replace("http://", "http://user:p%40ss@") + "/simple/x/"
    net.get(url, deadline_s=5, max_bytes=1024)
    assert seen["index"] == "Basic dXNlcjpwQHNz" and seen["other"] is None   # base64("user:p@ss")


def test_a_server_that_trickles_is_cut_at_the_deadline(serve, no_proxy_env):
    def slow(h):
        h.send_response(200)
        h.end_headers()
        for _ in range(60):
            h.wfile.write(b"x")
            h.wfile.flush()
            time.sleep(0.2)
    url = serve("127.0.0.1", slow)
    t0 = time.monotonic()
    with pytest.raises(net.DeadlineExceeded, match="no whole answer within 1 s"):
        net.get(url, deadline_s=1.0, max_bytes=1 << 20)
    assert time.monotonic() - t0 < 3.0


def test_a_server_that_trickles_its_headers_is_cut_too(serve, no_proxy_env):
    def slow_headers(h):
        h.wfile.write(b"HTTP/1.1 200 OK\r\n")
        for i in range(60):
            h.wfile.write(f"X-Pad-{i}: 1\r\n".encode())
            h.wfile.flush()
            time.sleep(0.2)
    url = serve("127.0.0.1", slow_headers)
    t0 = time.monotonic()
    with pytest.raises(net.DeadlineExceeded):
        net.get(url, deadline_s=1.0, max_bytes=1 << 20)
    assert time.monotonic() - t0 < 3.0


def test_an_endless_body_is_refused_at_its_cap(serve, no_proxy_env):
    url = serve("127.0.0.1", endless)
    with pytest.raises(net.TooLarge, match="goes on past 1,048,576 bytes"):
        net.get(url, deadline_s=10, max_bytes=1 << 20)


def test_a_declared_length_over_the_cap_is_refused_before_reading(serve, no_proxy_env):
    url = serve("127.0.0.1", lambda h: reply(h, body=b"y" * 5000))
    with pytest.raises(net.TooLarge, match="5,000 bytes; at most 100"):
        net.get(url, deadline_s=5, max_bytes=100)
    assert net.get(url, deadline_s=5, max_bytes=5000).body == b"y" * 5000


def test_metrics_from_a_hostile_server_is_one_line_and_exit_2(serve, no_proxy_env):
    url = serve("127.0.0.1", endless)
    with pytest.raises(BadOption, match=r"--metrics .*goes on past .* bytes"):
        exports.fetch(url + "/metrics", timeout=20)


def test_an_error_status_keeps_its_code_and_the_start_of_its_body(serve, no_proxy_env):
    url = serve("127.0.0.1", lambda h: reply(h, 403, b'{"detail": "forbidden"}'))
    with pytest.raises(net.HTTPStatus) as info:
        net.get(url, deadline_s=5, max_bytes=1024)
    assert info.value.code == 403 and b"forbidden" in info.value.body


def test_loopback_never_goes_through_the_proxy(serve, no_proxy_env):
    no_proxy_env.setenv("http_proxy", "http://127.0.0.1:9")     # nothing listens there
    url = serve("127.0.0.1", lambda h: reply(h, body=b"direct"))
    assert net.get(url, deadline_s=5, max_bytes=1024).text() == "direct"
    assert net.healthy(url + "/health", deadline_s=5)


def test_other_hosts_go_through_the_users_proxy(serve, no_proxy_env):
    asked = []

    def proxy(h):                      # a forward proxy answers for the absolute URL it was asked
        asked.append(h.path)
        reply(h, body=b"via proxy")
    p = serve("127.0.0.1", proxy)
    no_proxy_env.setenv("http_proxy", p)
    assert net.get("http://index.example.invalid/simple/", deadline_s=5, max_bytes=1024).text() == "via proxy"
    assert asked == ["http://index.example.invalid/simple/"]
    no_proxy_env.setenv("no_proxy", "index.example.invalid")
    assert net.proxy_for("http://index.example.invalid/simple/") is None


def test_a_failing_proxy_is_named(no_proxy_env):
    no_proxy_env.setenv("http_proxy", "http://127.0.0.1:9")
    with pytest.raises(net.NetError, match=r"through the proxy http://127.0.0.1:9 \(from http_proxy\)"):
        net.get("http://index.example.invalid/simple/", deadline_s=5, max_bytes=1024)


def test_a_proxys_password_is_not_printed(no_proxy_env):
    no_proxy_env.setenv("https_proxy", "http://me:hunter2@127.0.0.1:9")
    via = net.proxy_for("https://pypi.example.invalid/simple/")
    assert via is not None and "hunter2" not in via[0] and via[1] == "https_proxy"


def test_download_is_whole_or_absent(serve, no_proxy_env, tmp_path):
    url = serve("127.0.0.1", lambda h: reply(h, body=b"z" * 3000))
    dest = tmp_path / "file.tar.gz"
    with pytest.raises(net.TooLarge):
        net.download(url, dest, deadline_s=5, max_bytes=1000)
    assert list(tmp_path.iterdir()) == []
    assert net.download(url, dest, deadline_s=5, max_bytes=3000) == 3000 and dest.read_bytes() == b"z" * 3000


@pytest.mark.parametrize("host,loop", [("127.0.0.1", True), ("127.9.9.9", True), ("::1", True),
                                       ("[::1]", True), ("localhost", True), ("10.0.0.1", False),
                                       ("metrics.internal", False), (None, False)])
def test_loopback_is_recognised(host, loop):
    assert net.is_loopback(host) is loop


def test_every_request_goes_through_the_one_client():
    """No module but helpers/net.py opens HTTP itself (urllib.request, http.client, requests, httpx)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    direct = {"urllib.request", "http.client", "requests", "httpx", "urllib3", "aiohttp"}
    found = []
    for f in sorted((root / "helpers").rglob("*.py")) + sorted((root / "benchmarks").glob("*.py")):
        if f.name == "net.py" and f.parent.name == "helpers":
            continue
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{f.relative_to(root)}: {n}" for n in names if n in direct]
    assert found == [], found
