"""One HTTP client for every request the workbook makes: a deployment's /metrics and a Prometheus, a package
index and the wheels it reads by ranges, llama.cpp's source, and the engines it starts on loopback.

Every request has

- **a total deadline**: from the first byte sent to the last read, however slowly a server trickles its
  answer (a per-read timeout alone lets a server that sends one byte a second hold a caller for ever);
- **a size cap** suited to what is read: a /metrics page is kilobytes, a wheel's ranges are bounded by the
  ranges asked for; a body past its cap is refused, not buffered;
- **credentials bound to the origin the user named**: a bearer token, or the ``user:password@`` of an index
  URL, is sent to that scheme, host and port only; a redirect elsewhere is followed without it;
- **loopback never through a proxy**, the user's proxy (``http_proxy``, ``https_proxy``, ``no_proxy``) for
  every other host; a request that fails through a proxy names the proxy.

Failures are ``NetError`` values (an ``OSError``), each a sentence naming the URL: ``HTTPStatus`` (the server
answered with an error status; its body's start is kept), ``DeadlineExceeded``, ``TooLarge``, ``NotHTTP``
(something answered, not as an HTTP server), and plain
``NetError`` for a connection that could not be made or broke.
"""
from __future__ import annotations

import base64
import http.client
import ipaddress
import json
import os
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

KB, MB = 1 << 10, 1 << 20
CHUNK = 64 * KB
USER_AGENT = "eagle3-workbook"
CREDENTIAL_HEADERS = ("Authorization", "Proxy-Authorization", "Cookie")


class NetError(OSError):
    """A request that did not give a whole answer: the message names the URL and why."""


class HTTPStatus(NetError):
    """The server answered with an error status."""

    def __init__(self, message: str, code: int, reason: str, body: bytes):
        super().__init__(message)
        self.code, self.reason, self.body = code, reason, body


class DeadlineExceeded(NetError):
    """No whole answer within the request's deadline."""


class TooLarge(NetError):
    """The answer is longer than the cap for what was asked."""


class NotHTTP(NetError):
    """Something answered, but not as an HTTP server."""


@dataclass(frozen=True)
class Response:
    url: str                       # where the answer came from, after redirects
    status: int
    headers: dict[str, str]
    body: bytes

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> object:
        return json.loads(self.body.decode("utf-8") or "null")


def is_loopback(host: str | None) -> bool:
    """127.0.0.0/8, ::1 and localhost: the engines the workbook starts, never sent through a proxy."""
    if not host:
        return False
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) with the scheme's default port filled in: what a credential is bound to."""
    p = urllib.parse.urlsplit(url)
    port = p.port or {"http": 80, "https": 443}.get(p.scheme)
    return p.scheme, (p.hostname or "").lower(), port


def proxy_for(url: str) -> tuple[str, str] | None:
    """(proxy URL, the variable it came from) that a request to ``url`` goes through, or None: loopback and
    hosts ``no_proxy`` names go direct."""
    p = urllib.parse.urlsplit(url)
    if is_loopback(p.hostname):
        return None
    proxies = urllib.request.getproxies()
    proxy = proxies.get(p.scheme)
    if not proxy or urllib.request.proxy_bypass(p.netloc):
        return None
    var = next((v for v in (f"{p.scheme}_proxy", f"{p.scheme.upper()}_PROXY", "all_proxy", "ALL_PROXY")
                if os.environ.get(v) == proxy), f"{p.scheme}_proxy")
    return _redact(proxy), var


def _redact(url: str) -> str:
    p = urllib.parse.urlsplit(url)
    if p.username is None:
        return url
    host = p.hostname or ""
    return urllib.parse.urlunsplit((p.scheme, f"{host}:{p.port}" if p.port else host, p.path, p.query, ""))


def split_credentials(url: str) -> tuple[str, str | None]:
    """(the URL without ``user:password@``, the Basic ``Authorization`` value it carried or None)."""
    p = urllib.parse.urlsplit(url)
    if p.username is None:
        return url, None
    user = urllib.parse.unquote(p.username)
    pw = urllib.parse.unquote(p.password or "")
    auth = "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode()
    return _redact(url), auth


class _Proxies(urllib.request.ProxyHandler):
    """The user's proxies, except for loopback (whatever ``no_proxy`` says)."""

    def proxy_open(self, req, proxy, type):  # noqa: A002 (urllib's name)
        if is_loopback(urllib.parse.urlsplit(req.full_url).hostname):
            return None
        return super().proxy_open(req, proxy, type)


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects, carrying the credential only back to the origin it was given for."""

    max_redirections = 5

    def __init__(self, bound: tuple[str, str, int | None], auth: str | None):
        super().__init__()
        self.bound, self.auth = bound, auth

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is None:
            return None
        for name in CREDENTIAL_HEADERS:
            new.remove_header(name)
        if self.auth and origin(newurl) == self.bound:
            new.add_unredirected_header("Authorization", self.auth)
        return new


@dataclass
class _Exchange:
    """One request run on a worker thread, so that the caller's deadline holds whatever the server does."""

    req: urllib.request.Request
    opener: urllib.request.OpenerDirector
    deadline_s: float
    max_bytes: int
    sink: BinaryIO | None
    cancelled: threading.Event = field(default_factory=threading.Event)
    response: Response | None = None
    error: BaseException | None = None
    _resp: object = None

    def run(self) -> None:
        try:
            self.response = self._go()
        except BaseException as exc:   # handed to the caller's thread
            self.error = exc
        finally:
            if self._resp is not None:
                self._resp.close()

    def _go(self) -> Response:
        url = self.req.full_url
        try:
            resp = self._resp = self.opener.open(self.req, timeout=self.deadline_s)
        except urllib.error.HTTPError as exc:
            body = _read_capped(exc, 4 * KB, None, self.cancelled)[0] if exc.fp else b""
            exc.close()
            raise HTTPStatus(f"{url}: HTTP {exc.code} {exc.reason}", exc.code, str(exc.reason),
                             body) from None
        size = resp.headers.get("Content-Length")
        if size and size.isdigit() and int(size) > self.max_bytes:
            raise TooLarge(f"{url}: the answer is {int(size):,} bytes; at most {self.max_bytes:,} are read "
                           f"for this request")
        body, n = _read_capped(resp, self.max_bytes, self.sink, self.cancelled)
        if n > self.max_bytes:
            raise TooLarge(f"{url}: the answer goes on past {self.max_bytes:,} bytes, the most read for this "
                           f"request")
        return Response(resp.geturl(), resp.status, {k: v for k, v in resp.headers.items()}, body)


def _read_capped(resp, cap: int, sink: BinaryIO | None, cancelled: threading.Event) -> tuple[bytes, int]:
    """Up to ``cap`` + 1 bytes (one past the cap says it is exceeded), into ``sink`` when given."""
    parts, n = [], 0
    while n <= cap and not cancelled.is_set():
        chunk = resp.read(min(CHUNK, cap + 1 - n))
        if not chunk:
            break
        n += len(chunk)
        if sink is not None:
            sink.write(chunk)
        else:
            parts.append(chunk)
    return b"".join(parts), n


def request(url: str, *, deadline_s: float, max_bytes: int, method: str | None = None,
            data: bytes | None = None, headers: dict[str, str] | None = None, auth: str | None = None,
            sink: BinaryIO | None = None) -> Response:
    """One HTTP exchange under the rules above. ``auth`` is an ``Authorization`` value bound to ``url``'s
    origin; a ``user:password@`` in ``url`` becomes one. With ``sink`` the body is written there, not kept.
    Raises ``NetError`` (``HTTPStatus`` for an error status)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise NetError(f"{url}: expected an http(s) URL with a host")
    url, url_auth = split_credentials(url)
    auth = auth or url_auth
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"User-Agent": USER_AGENT, **(headers or {})})
    if auth:
        req.add_unredirected_header("Authorization", auth)
    opener = urllib.request.build_opener(_Proxies(), _Redirects(origin(url), auth))
    ex = _Exchange(req, opener, deadline_s, max_bytes, sink)
    worker = threading.Thread(target=ex.run, name=f"net {parts.hostname}", daemon=True)
    worker.start()
    worker.join(deadline_s)
    if worker.is_alive():
        ex.cancelled.set()
        raise DeadlineExceeded(f"{url}: no whole answer within {deadline_s:g} s")
    if ex.error is not None:
        raise _explained(url, ex.error)
    assert ex.response is not None
    return ex.response


def _explained(url: str, exc: BaseException) -> BaseException:
    """A failure as one NetError sentence naming the URL (and the proxy, when one was in the way)."""
    if isinstance(exc, NetError):
        return exc
    if not isinstance(exc, (OSError, http.client.HTTPException, ValueError)):
        return exc
    if isinstance(exc, http.client.HTTPException):
        return NotHTTP(f"{url}: did not answer as an HTTP server ({type(exc).__name__}: {str(exc)[:120]!r})")
    reason = getattr(exc, "reason", None) or exc
    why = getattr(reason, "strerror", None) or str(reason) or type(reason).__name__
    if isinstance(reason, TimeoutError) or "timed out" in why:
        return DeadlineExceeded(f"{url}: no answer in time ({why})")
    via = proxy_for(url)
    if via is not None:
        return NetError(f"{url}: cannot read it through the proxy {via[0]} (from {via[1]}): {why}")
    return NetError(f"{url}: cannot read it ({why})")


def get(url: str, *, deadline_s: float, max_bytes: int, headers: dict[str, str] | None = None,
        auth: str | None = None) -> Response:
    return request(url, deadline_s=deadline_s, max_bytes=max_bytes, headers=headers, auth=auth)


def post_json(url: str, payload: object, *, deadline_s: float, max_bytes: int) -> Response:
    return request(url, deadline_s=deadline_s, max_bytes=max_bytes, method="POST",
                   data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})


def download(url: str, dest: Path, *, deadline_s: float, max_bytes: int) -> int:
    """The body of ``url`` written to ``dest`` (whole or not at all); its length in bytes."""
    part = dest.with_name(dest.name + ".part")
    try:
        with part.open("wb") as f:
            request(url, deadline_s=deadline_s, max_bytes=max_bytes, sink=f)
        n = part.stat().st_size
        part.replace(dest)
        return n
    finally:
        part.unlink(missing_ok=True)


def healthy(url: str, deadline_s: float = 5.0) -> bool:
    """A GET that answered 200 within the deadline: an engine's /health."""
    try:
        return get(url, deadline_s=deadline_s, max_bytes=64 * KB).status == 200
    except NetError:
        return False
