"""``scrapy openclaw-ctl``: live control of a running crawl (hold, limit, give up, pause, close).

It calls the control API on a worker's metrics port (``--url``, default the
project's ``OPENCLAW_METRICS_HOST``/``PORT``) with the token from ``--token``,
the environment variable ``OPENCLAW_CONTROL_TOKEN`` or the setting. With
``--redis`` (distributed mode) it writes to the crawl's Redis instead: every
worker applies the command.
"""

from __future__ import annotations

import getpass
import json
import math
import os
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, ClassVar

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from scrapy_openclaw.commands.dlq import parse_time
from scrapy_openclaw.control.controller import CRAWL_COMMANDS, DOMAIN_COMMANDS, ControlError, validate
from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.redact import mask_uri
from scrapy_openclaw.settings import DEFAULTS, OpenClawSettings

if TYPE_CHECKING:
    import argparse

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
TIMEOUT = 10.0


def parse_duration(value: str) -> float:
    """Seconds from ``90``, ``90s``, ``15m``, ``2h``, ``1d``."""
    text = value.strip()
    unit = _UNITS.get(text[-1:], None)
    try:
        seconds = float(text[:-1] if unit else text) * (unit or 1)
    except ValueError:
        raise UsageError(f"--for {value!r}: expected a duration like 90, 15m, 2h", print_help=False) from None
    if not math.isfinite(seconds) or seconds < 0:
        raise UsageError(f"--for {value!r}: expected a duration >= 0", print_help=False)
    return seconds


def _no_control_api(url: str) -> str:
    return (
        f"{mask_uri(url)} serves metrics but no control API: live control is off in that crawl. "
        "Start the crawl with OPENCLAW_CONTROL_TOKEN set (16 characters or more) and give the same token "
        "here (--token, or OPENCLAW_CONTROL_TOKEN in the environment or the settings)"
    )


def _when(ts: Any) -> str:
    if not ts:
        return "-"
    return datetime.fromtimestamp(float(ts), timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _printable(value: Any) -> str:
    return "".join(ch if ch.isprintable() else "?" for ch in str(value))


def format_domains(data: dict[str, Any]) -> str:
    """The ``domains`` answer as a table (what docs/operating.md shows)."""
    header = (
        f"{'DOMAIN':<24} {'HEALTH':>6} {'RATE':>8} {'CONC':>4}  {'CIRCUIT':<9} {'HELD UNTIL (UTC)':<19} "
        f"{'PENDING':>7}  OVERRIDES"
    )
    lines = [header]
    for row in data.get("domains", []):
        ov = row.get("overrides") or {}
        marks = []
        if ov.get("hold_until"):
            marks.append("hold")
        if ov.get("rate"):
            marks.append(f"rate<={ov['rate']:g}")
        if ov.get("concurrency"):
            marks.append(f"conc={ov['concurrency']}")
        if row.get("given_up"):
            marks.append("GIVEN UP" + (" (operator)" if ov.get("given_up") else ""))
        rate = "inf" if row.get("rate") is None else f"{row['rate']:.1f}"  # (nothing paces the domain)
        lines.append(
            f"{_printable(row['domain'])[:24]:<24} {row.get('health', 0):>6.1f} {rate:>8} "
            f"{row.get('concurrency', 0):>4}  {_printable(row.get('circuit', '?')):<9} "
            f"{_when(row.get('held_until')):<19} {row.get('pending', 0):>7}  {', '.join(marks) or '-'}"
        )
    if "paused" in data:
        lines.append(f"crawl: {'PAUSED' if data['paused'] else 'running'}, {len(data.get('domains', []))} domains")
    return "\n".join(lines)


class Command(ScrapyCommand):
    requires_project = False
    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}
    _validated: OpenClawSettings | None = None  # (the settings, once validated: see _config)

    def syntax(self) -> str:
        return (
            "domains | hold DOMAIN (--for 10m | --until TIME) | release DOMAIN | "
            "limit DOMAIN [--rate R|off] [--concurrency N|off] | give-up DOMAIN | restore DOMAIN | "
            "pause | resume | close [--reason R]"
        )

    def short_desc(self) -> str:
        return "Control a running crawl: hold, limit or give up a domain; pause, resume or close the crawl"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument(
            "--url",
            help="a worker's control endpoint, http://HOST:PORT "
            "(default: OPENCLAW_METRICS_HOST and OPENCLAW_METRICS_PORT)",
        )
        parser.add_argument("--token", help="the control token (default: $OPENCLAW_CONTROL_TOKEN or the setting)")
        parser.add_argument(
            "--redis",
            nargs="?",
            const="",
            default=None,
            metavar="URL",
            help="send through Redis to every worker (the URL defaults to REDIS_URL)",
        )
        parser.add_argument("--spider", help="the spider's name (with --redis: the crawl's Redis keys)")
        parser.add_argument("--for", dest="for_", metavar="DURATION", help="hold: for 90s, 15m, 2h, 1d")
        parser.add_argument("--until", metavar="TIME", help="hold: until a UNIX or ISO time (UTC)")
        parser.add_argument("--rate", help="limit: the rate ceiling in requests/s, or 'off'")
        parser.add_argument("--concurrency", help="limit: concurrent requests, or 'off'")
        parser.add_argument("--reason", help="close: the finish reason (default openclaw_ctl)")
        parser.add_argument("--json", action="store_true", help="print the answer as JSON")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        command = self.build(args, opts)
        try:
            checked = validate(command)
        except ControlError as exc:
            raise UsageError(str(exc), print_help=False) from None
        if opts.redis is not None:
            answer, status = self._via_redis(checked, opts)
        else:
            answer, status = self._via_http(checked, opts)
        self.exitcode = 0 if status == 200 else 1
        if opts.json or status != 200:
            print(
                json.dumps(answer, indent=1, sort_keys=True)
                if opts.json
                else f"error{f' (HTTP {status})' if status else ''}: {_printable(answer.get('error', answer))}"
            )
            return
        print(self.describe(answer))

    @staticmethod
    def build(args: list[str], opts: argparse.Namespace) -> dict[str, Any]:
        if not args:
            raise UsageError(
                "expected a command: domains, hold, release, limit, give-up, restore, pause, resume, close"
            )
        name = args[0].replace("-", "_")
        command: dict[str, Any] = {"command": name}
        if name in DOMAIN_COMMANDS:
            if len(args) != 2:
                raise UsageError(f"{args[0]}: expected one DOMAIN")
            command["domain"] = args[1]
        elif len(args) != 1:
            raise UsageError(f"{args[0]}: takes no arguments")
        if name == "hold":
            if opts.for_ is not None:
                command["for"] = parse_duration(opts.for_)
            if opts.until is not None:
                command["until"] = (
                    parse_time(opts.until, "--until") if not opts.until.strip().isdigit() else float(opts.until)
                )
        if name == "limit":
            for option in ("rate", "concurrency"):
                value = getattr(opts, option)
                if value is None:
                    continue
                if value.strip().lower() in ("off", "none", "clear"):
                    command[option] = None
                    continue
                try:
                    command[option] = float(value) if option == "rate" else int(value)
                except ValueError:
                    raise UsageError(f"--{option} {value!r}: expected a number or 'off'", print_help=False) from None
        if name == "close" and opts.reason:
            command["reason"] = opts.reason
        return command

    def _config(self) -> OpenClawSettings | None:
        """The project's ``OPENCLAW_*`` settings, validated once (None outside a project)."""
        if self.settings is None:
            return None
        if self._validated is None:
            try:
                self._validated = OpenClawSettings.from_settings(self.settings)
            except OpenClawConfigError as exc:
                raise UsageError(str(exc), print_help=False) from None
        return self._validated

    def _token(self, opts: argparse.Namespace) -> str:
        config = self._config()
        return (
            opts.token or os.environ.get("OPENCLAW_CONTROL_TOKEN") or (config.control_token if config else None) or ""
        )

    def _via_http(self, command: dict[str, Any], opts: argparse.Namespace) -> tuple[dict[str, Any], int]:
        url = opts.url
        if not url:
            config = self._config()
            port = config.metrics_port if config else 0
            if not port:
                raise UsageError(
                    "no endpoint: give --url http://HOST:PORT (or set OPENCLAW_METRICS_PORT), or --redis",
                    print_help=False,
                )
            host = config.metrics_host if config else DEFAULTS["OPENCLAW_METRICS_HOST"]
            url = f"http://{host}:{port}"
        name = command["command"]
        body = None if name == "domains" else json.dumps(command).encode("utf-8")
        request = urllib.request.Request(
            f"{url.rstrip('/')}/control/{name}",
            data=body,
            method="GET" if body is None else "POST",
            headers={
                "Authorization": f"Bearer {self._token(opts)}",
                "Content-Type": "application/json",
                "X-OpenClaw-Operator": _operator(),
            },
        )
        try:
            with _OPENER.open(request, timeout=TIMEOUT) as response:  # (http only)
                return json.loads(response.read() or b"{}"), response.status
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                where = mask_uri(exc.headers.get("Location", "") or "")
                return {"error": f"{mask_uri(url)} answered a redirect to {where!r}: not followed"}, exc.code
            try:
                return json.loads(exc.read() or b"{}"), exc.code
            except ValueError:  # not our API's JSON: no control API under this URL
                if exc.code == 404:
                    return {"error": _no_control_api(url)}, exc.code
                return {"error": exc.reason}, exc.code
        except (OSError, ValueError) as exc:
            return {"error": f"{mask_uri(url)}: {exc}"}, 0

    def _via_redis(self, command: dict[str, Any], opts: argparse.Namespace) -> tuple[dict[str, Any], int]:
        import redis

        from scrapy_openclaw.control.channel import publish

        self._config()  # commands are sealed with the crawl's store key
        url = opts.redis or (self.settings.get("REDIS_URL") if self.settings else None)
        if not url:
            raise UsageError("--redis: give a URL or set REDIS_URL", print_help=False)
        if not opts.spider:
            raise UsageError("--redis needs --spider NAME (the crawl's Redis keys start with it)", print_help=False)
        from scrapy_openclaw.distributed.connection import client_for_url

        server = client_for_url(url, socket_timeout=TIMEOUT)
        try:
            if command["command"] == "domains":
                queue_key = (
                    self.settings.get("SCHEDULER_QUEUE_KEY") if self.settings else None
                ) or "%(spider)s:requests"
                config = self._config()
                shards = config.distributed_shards if config else DEFAULTS["OPENCLAW_DISTRIBUTED_SHARDS"]
                return redis_domains(server, opts.spider, queue_key % {"spider": opts.spider}, shards), 200
            eid = publish(server, opts.spider, command, _operator())
        except redis.RedisError as exc:
            return {"error": f"{mask_uri(url)}: {exc}"}, 0
        finally:
            server.close()
        return {"ok": True, **command, "sent": eid, "note": "every worker applies it at its next poll"}, 200

    @staticmethod
    def describe(answer: dict[str, Any]) -> str:
        name = answer.get("command")
        if name == "domains":
            return format_domains(answer)
        parts = [str(name).replace("_", "-")]
        if "domain" in answer:
            parts.append(_printable(answer["domain"]))
        if "until" in answer:
            parts.append(f"until {_when(answer['until'])} UTC")
        for key in ("rate", "concurrency"):
            if key in answer:
                parts.append(f"{key}={'off' if answer[key] is None else answer[key]}")
        if "reason" in answer:
            parts.append(f"reason={_printable(answer['reason'])}")
        text = " ".join(parts) + (": sent through Redis" if "sent" in answer else ": done")
        if isinstance(answer.get("domain_state"), dict):
            text += "\n" + format_domains({"domains": [answer["domain_state"]]})
        if name == "close":
            text += "\ncrawl: closing (requests in flight finish first)"
        elif "paused" in answer and name in CRAWL_COMMANDS:
            text += f"\ncrawl: {'PAUSED' if answer['paused'] else 'running'}"
        return text


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: the bearer token goes only to the URL the operator gave."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


#: No proxies from the environment (``http_proxy`` would receive the token), no redirects.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirects())


def _operator() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no user name in this environment
        return "unknown"


def redis_domains(server: Any, spider: str, queue_key: str | None = None, shards: int = 16) -> dict[str, Any]:
    """Every domain's shared state read from Redis (distributed mode), in the API's ``domains`` shape."""
    from scrapy_openclaw.distributed.fields import read_state
    from scrapy_openclaw.distributed.shards import ShardKeys, health_domains_key, health_key

    now = time.time()
    layout = ShardKeys(queue_key or f"{spider}:requests", spider, shards)
    rows = []
    names: list[Any] = []
    for shard in range(shards):
        names += server.smembers(health_domains_key(spider, shard))
    for raw in sorted(names):
        domain = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        fields = read_state(server, health_key(spider, domain, shards))

        def num(name: str) -> float:
            try:
                return float(fields.get(name) or 0)
            except (TypeError, ValueError):
                return 0.0

        circuit = fields.get("circuit", "closed")
        blocked = max(
            num("hold_until"), num("ctl_hold"), num("opened_at") + num("cooldown") if circuit == "open" else 0.0
        )
        rate = num("rate")
        if num("ctl_rate") > 0:
            rate = min(rate, num("ctl_rate"))
        rows.append(
            {
                "domain": domain,
                "health": num("health"),
                "rate": rate if rate < 100000 else None,
                "concurrency": int(num("ctl_concurrency")) or 0,
                "circuit": circuit,
                "held_until": blocked if blocked > now else None,
                "given_up": bool(num("ctl_down")),
                # (ready to pop, not delayed or leased)
                "pending": int(
                    server.zlexcount(layout.name("q", layout.of(domain)), f"[{domain}\x01", f"[{domain}\x01\xff")
                ),
                "overrides": {
                    "hold_until": num("ctl_hold") or None,
                    "rate": num("ctl_rate") or None,
                    "concurrency": int(num("ctl_concurrency")) or None,
                    "given_up": bool(num("ctl_down")),
                },
            }
        )
    return {"ok": True, "command": "domains", "domains": rows}
