"""Who may look, and what every response says about itself.

The Host header, when there is one, is exactly `host[:port]` (a hostname, an IPv4 address or
a bracketed IPv6 address; the port 1-5 ASCII digits), else the request is refused. On a
loopback address (127.0.0.1, ::1, localhost) no token is asked, but the Host header must
name the loopback too, so that a web page elsewhere cannot reach the server through a DNS
name it rebinds to 127.0.0.1. On any other address a token is required: the app refuses to
start without one, and every request (pages, /api, assets) must carry it, as
`Authorization: Bearer TOKEN`, as the cookie set when a page was opened with `?token=TOKEN`
(the address is then reloaded without it, as a path on this server: never `//elsewhere`),
compared in constant time.

Every response carries a Content-Security-Policy (scripts and styles from the server only,
nothing fetched from anywhere else, no frames), `nosniff` and no referrer.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from mgit.errors import TokenRequiredError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

COOKIE = "mgit_token"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
LOOPBACK_NAMES = ("localhost",)
HOST_RE = re.compile(r"(?:\[(?P<ip6>[0-9A-Fa-f:.]{2,45})\]|(?P<name>[A-Za-z0-9.-]{1,253}))(?::(?P<port>[0-9]{1,5}))?")
LABEL_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def is_loopback(host: str) -> bool:
    name = host.strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def new_token() -> str:
    return secrets.token_urlsafe(24)


def check_setup(host: str, token: str | None) -> None:
    """Refuse a server that anyone on the network could read."""
    if not is_loopback(host) and not token:
        raise TokenRequiredError(host)


def token_matches(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


class Guard:
    """ASGI middleware: the token (or, without one, a loopback Host), and security headers."""

    def __init__(self, app: ASGIApp, *, token: str | None, csp: Callable[[str], str | None]) -> None:
        self.app, self.token, self.csp = app, token, csp

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        pairs = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope.get("headers", [])]
        headers = dict(pairs)
        hosts = [v for k, v in pairs if k == "host"]
        host = host_name(hosts[0]) if len(hosts) == 1 else None
        if len(hosts) > 1 or (hosts and host is None):
            await _refuse(send, 400, "a bad Host header")
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        if self.token is None:
            if host is None or not is_loopback(host):
                await _refuse(send, 400, "this server answers only to localhost and 127.0.0.1")
                return
        else:
            given = dict(query).get("token")
            if given is not None:  # a link with the token: keep it in a cookie, drop it from the address
                if not token_matches(given, self.token):
                    await _refuse(send, 401, "wrong token")
                    return
                rest = urlencode([(k, v) for k, v in query if k != "token"])
                # One leading slash: `//evil.example/x` would send the browser to another host.
                path = "/" + quote(scope["path"]).lstrip("/")
                await _redirect(send, path + (f"?{rest}" if rest else ""), self.token)
                return
            bearer = headers.get("authorization", "")
            given = bearer[7:] if bearer.lower().startswith("bearer ") else _cookie(headers.get("cookie", ""))
            if not token_matches(given, self.token):
                await _refuse(send, 401, "a token is needed: open the address mgit serve printed")
                return
        csp = self.csp(scope["path"]) or CSP

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = [
                    (b"content-security-policy", csp.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                    (b"x-frame-options", b"DENY"),
                    (b"cache-control", b"no-store"),
                ]
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, with_headers)


def host_name(header: str) -> str | None:
    """`127.0.0.1` of `127.0.0.1:8808`, `::1` of `[::1]:8808`, `localhost` of `LocalHost`;
    None unless the header is exactly a hostname or an IP address and an optional port
    (`localhost:80@evil.com` is not one)."""
    m = HOST_RE.fullmatch(header)
    if m is None or (m["port"] is not None and not 0 < int(m["port"]) < 65536):
        return None
    if m["ip6"] is not None:
        try:
            return str(ipaddress.IPv6Address(m["ip6"]))
        except ValueError:
            return None
    name = m["name"].lower()
    return name if all(LABEL_RE.fullmatch(label) for label in name.removesuffix(".").split(".")) else None


def _cookie(header: str) -> str | None:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except Exception:  # a malformed cookie header is no token
        return None
    morsel = jar.get(COOKIE)
    return morsel.value if morsel is not None else None


async def _refuse(send: Send, status: int, why: str) -> None:
    body = f"{status}: {why}\n".encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"content-security-policy", CSP.encode()),
                (b"x-content-type-options", b"nosniff"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _redirect(send: Send, location: str, token: str) -> None:
    cookie = f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
    await send(
        {
            "type": "http.response.start",
            "status": 303,
            "headers": [
                (b"location", location.encode("latin-1", "replace")),
                (b"set-cookie", cookie.encode()),
                (b"content-length", b"0"),
                (b"referrer-policy", b"no-referrer"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": b""})
