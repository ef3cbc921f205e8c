"""The politeness report for people: a table for the crawl log, a short text for a site's operator."""

from __future__ import annotations

import json
import time
from typing import Any

COLUMNS = (
    ("domain", None),
    ("requests", "requests"),
    ("peak/1s", "busiest_1s"),
    ("peak/5s", "busiest_5s"),
    ("2xx", None),
    ("4xx", None),
    ("5xx", None),
    ("429", "throttled_429"),
    ("503", "unavailable_503"),
    ("retry-after", None),
    ("held s", "held_seconds"),
    ("circuit", "circuit_openings"),
    ("crawl-delay", None),
    ("disallowed", None),
    ("MB", None),
    ("dead", None),
)


def _cells(domain: str, e: dict[str, Any]) -> tuple[str, ...]:
    answers = e["answers"]
    ra = e["retry_after"]
    cells = []
    for title, key in COLUMNS:
        if key is not None:
            value = e[key]
            cells.append(f"{value:.0f}" if isinstance(value, float) else str(value))
        elif title == "domain":
            cells.append(domain)
        elif title in ("2xx", "4xx", "5xx"):
            cells.append(str(answers.get(title, 0)))
        elif title == "retry-after":
            cells.append(f"{ra['received']} (max {ra['largest_seconds']:g}s)" if ra["received"] else "-")
        elif title == "crawl-delay":
            delay = e["robots_txt"]["crawl_delay"]
            cells.append(f"{delay:g}s" if delay else "-")
        elif title == "disallowed":
            cells.append(str(e["robots_txt"].get("disallowed", 0)))
        elif title == "MB":
            cells.append(f"{e['bytes'] / 1e6:.2f}")
        else:
            cells.append(str(sum(e["dead_letters"].values())))
    return tuple(cells)


def table(report: dict[str, Any], rows: int) -> str:
    """The busiest *rows* domains (busiest 1 s first), one line each; '' without domains."""
    domains = report["domains"]
    if not domains or rows <= 0:
        return ""
    top = list(domains.items())[:rows]
    lines = [tuple(t for t, _ in COLUMNS), *(_cells(d, e) for d, e in top)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
    body = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))) for line in lines
    ]
    workers = f", {report['workers']} workers" if report.get("workers", 1) > 1 else ""
    title = f"OpenClaw politeness report (top {len(top)} of {len(domains)} domains by busiest second{workers}):"
    return "\n".join([title, *body])


def text(report: dict[str, Any], domain: str) -> str:
    """A few sentences a site operator can be sent about what the crawl did to *domain*."""
    e = report["domains"][domain]
    when = _period(report)
    answers = ", ".join(f"{n} {cls}" for cls, n in e["answers"].items()) or "no answers"
    lines = [
        f"Crawl {report['crawl_id']} (spider {report['spider']}) {when} sent {e['requests']} requests to {domain}"
        + (f" ({e['retries']} of them retries)." if e["retries"] else "."),
        f"The busiest second carried {e['busiest_1s']} requests; the busiest 5 seconds {e['busiest_5s']} "
        f"({e['busiest_5s'] / 5:.1f} per second).",
        f"Your server answered: {answers}; {e['errors']} request(s) got no answer. {e['bytes']} bytes were downloaded.",
    ]
    ra = e["retry_after"]
    if e["throttled_429"] or e["unavailable_503"] or ra["received"]:
        lines.append(
            f"It received {e['throttled_429']} '429 Too Many Requests' and {e['unavailable_503']} '503' answers"
            + (f", {ra['received']} with Retry-After (largest {ra['largest_seconds']:g} s)" if ra["received"] else "")
            + "; it slowed down after each"
            + (
                f" and waited out {ra['honoured']} Retry-After(s), {ra['held_seconds']:.0f} s in all."
                if ra.get("honoured")
                else "."
            )
        )
    if e.get("declared_limit"):
        lines.append(
            f"Your server said its limit was {e['declared_limit']:g} requests per second (RateLimit headers); "
            f"the crawl kept its pace under it."
        )
    robots = e["robots_txt"]
    if robots["status"] is not None:
        delay = (
            f" and spaced its requests by its Crawl-delay of {robots['crawl_delay']:g} s"
            if robots["crawl_delay"]
            else ""
        )
        lines.append(f"It fetched robots.txt (HTTP {robots['status']}){delay}.")
    if robots.get("disallowed"):
        shown = ", ".join(robots.get("disallowed_paths", []))
        lines.append(
            f"Your robots.txt disallowed {robots['disallowed']} URL(s) it found (e.g. {shown}); it sent none of them."
        )
    if e["circuit_openings"]:
        lines.append(
            f"It paused the whole site {e['circuit_openings']} time(s) when it looked overloaded"
            + (f", {e['circuit_seconds']:.0f} s in all." if e.get("circuit_seconds") else ".")
        )
    return "\n".join(lines)


def _period(report: dict[str, Any]) -> str:
    fmt = "%Y-%m-%d %H:%M:%S UTC"
    start = time.strftime(fmt, time.gmtime(report["started_at"]))
    end = time.strftime(fmt, time.gmtime(report["finished_at"]))
    return f"from {start} to {end}"


def as_json(report: dict[str, Any], domain: str | None = None) -> str:
    if domain is not None:
        report = {**report, "domains": {domain: report["domains"][domain]}}
    return json.dumps(report, indent=1, sort_keys=False)
