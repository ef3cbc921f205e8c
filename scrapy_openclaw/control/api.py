"""The control API under ``/control/`` on the metrics port (see docs/operating.md).

``GET /control/domains``; ``POST /control/<command>`` with a JSON object body.
Every call needs ``Authorization: Bearer <OPENCLAW_CONTROL_TOKEN>``, compared
in constant time; without it the answer is 401 and nothing runs. The token and
the body's declared size are checked from the headers (:meth:`ControlResource.guard`,
asked by the metrics site before the body is read); refusals are counted and
their warnings condensed (one a minute, with the count).
"""

from __future__ import annotations

import hmac
import json
from typing import TYPE_CHECKING, Any

from scrapy.utils.python import to_unicode
from twisted.web.resource import Resource

from scrapy_openclaw._metrics_http import MAX_BODY, Refusal, refusal_warnings
from scrapy_openclaw.control.controller import COMMANDS, ControlError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from twisted.web.http_headers import Headers
    from twisted.web.server import Request

    from scrapy_openclaw.control.controller import Controller

OPERATOR_HEADER = b"X-OpenClaw-Operator"
_REALM = b'Bearer realm="openclaw-control"'


class ControlResource(Resource):
    isLeaf = True

    def __init__(self, controller: Controller, token: str):
        super().__init__()
        self.controller = controller
        self._token = token.encode("utf-8")

    def guard(self, method: bytes, path: bytes, headers: Headers, length: int | None) -> Refusal | None:
        """Judge a call by its headers alone (asked before its body is read): 401 without the token."""
        if self._token_ok(headers.getRawHeaders(b"authorization") or [b""]):
            return None
        self.controller.stats.inc_value("openclaw/control/unauthorized")
        refusal_warnings.warn(
            "token",
            "Control API: refused a %(method)s %(path)r (missing or wrong token)",
            {"method": to_unicode(method, errors="replace"), "path": to_unicode(path, errors="replace")[:100]},
        )
        return 401, {"ok": False, "error": "missing or wrong token"}, {b"WWW-Authenticate": _REALM}

    def render_GET(self, request: Request) -> bytes:  # (twisted's names)
        return self._handle(request, "GET")

    def render_POST(self, request: Request) -> bytes:
        return self._handle(request, "POST")

    def _handle(self, request: Request, method: str) -> bytes:
        refusal = self.guard(method.encode(), request.path, request.requestHeaders, None)
        if refusal is not None:  # (the site asks first; this is for a site that did not)
            status, data, headers = refusal
            for header, value in headers.items():
                request.setHeader(header, value)
            return _reply(request, status, data)
        assert request.postpath is not None  # (the Site sets it before rendering)
        path = [p for p in request.postpath if p]
        name = to_unicode(path[0], errors="replace").replace("-", "_") if len(path) == 1 else ""
        if name not in COMMANDS:
            return _reply(request, 404, {"ok": False, "error": f"unknown command; one of {', '.join(COMMANDS)}"})
        if (method == "GET") != (name == "domains"):
            return _reply(request, 405, {"ok": False, "error": "GET /control/domains; POST every other command"})
        command: Any = {}
        if method == "POST":
            body = request.content.read(MAX_BODY + 1) if request.content is not None else b""
            if len(body) > MAX_BODY:
                return _reply(request, 413, {"ok": False, "error": f"body larger than {MAX_BODY} bytes"})
            try:
                command = json.loads(body or b"{}")
            except ValueError as exc:
                return _reply(request, 400, {"ok": False, "error": f"body is not JSON: {exc}"})
            if not isinstance(command, dict):
                return _reply(request, 400, {"ok": False, "error": "body must be a JSON object"})
        command["command"] = name
        try:
            result = self.controller.execute(command, who=_who(request))
        except ControlError as exc:
            return _reply(request, 400, {"ok": False, "error": str(exc)})
        return _reply(request, 200, result)

    def _token_ok(self, values: Sequence[bytes]) -> bool:
        header = values[0]
        if isinstance(header, str):
            header = header.encode("utf-8", "replace")
        scheme, _, given = header.partition(b" ")
        # (compare_digest's time depends only on the length of the given value, not on the token)
        return hmac.compare_digest(given.strip(), self._token) and scheme.lower() == b"bearer"


def _client(request: Request) -> str:
    peer = request.getClientAddress()
    return str(getattr(peer, "host", peer))


def _who(request: Request) -> str:
    """The operator's name as the client states it (informative, not authenticated) and address."""
    name = to_unicode(request.getHeader(OPERATOR_HEADER) or b"", errors="replace")
    name = "".join(ch for ch in name if ch.isprintable())[:64] or "anonymous"
    return f"{name}@{_client(request)}"


def _reply(request: Request, status: int, data: dict[str, Any]) -> bytes:
    request.setResponseCode(status)
    request.setHeader(b"Content-Type", b"application/json")
    request.setHeader(b"Cache-Control", b"no-store")
    return json.dumps(data, sort_keys=True).encode("utf-8")
