"""Every counter of ``/metrics`` from the first scrape, at 0 until it counts.

Prometheus shows a counter that was never exported as "No data", and a ``rate()``
over it as nothing at all; a crawl that has not failed yet should read 0 failures.
A label whose values cannot be listed in advance (``reason``) is left as it is.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from scrapy_openclaw.errors import ErrorClass
from scrapy_openclaw.metrics.collector import OTHER

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from prometheus_client.metrics_core import Metric

#: The values a label can take, for the labels whose values are known before they occur.
KNOWN_VALUES: dict[str, tuple[str, ...]] = {
    "status_class": ("2xx", "3xx", "4xx", "5xx"),
    "error_class": tuple(sorted(c.value for c in ErrorClass)),
}


def zero_filled(families: Iterable[Metric], *, spider: str, domains: list[str]) -> list[Metric]:
    """*families* with a 0 sample added for each missing label combination of each counter."""
    values = {**KNOWN_VALUES, "spider": (spider,), "domain": tuple(domains) or (OTHER,)}
    out = []
    for family in families:
        out.append(family)
        if family.type != "counter":
            continue
        # (prometheus_client keeps a custom family's label names only here)
        names: tuple[str, ...] = getattr(family, "_labelnames", ())
        if any(name not in values for name in names):
            continue
        seen = {tuple(s.labels.get(n, "") for n in names) for s in family.samples if s.name.endswith("_total")}
        domain_values = values["domain"]
        if OTHER not in domain_values and any(s.labels.get("domain") == OTHER for s in family.samples):
            domain_values += (OTHER,)  # (the untracked domains' row, once it exists)
        choices = [domain_values if n == "domain" else values[n] for n in names]
        for combination in itertools.product(*choices):
            if combination not in seen:
                family.add_metric(list(combination), 0.0)  # type: ignore[attr-defined]
    return out


class ZeroFilled:
    """A collector wrapper: *collector*'s families, zero-filled (see :func:`zero_filled`)."""

    def __init__(self, collector: Any, domains: Callable[[], list[str]], spider_name: Callable[[], str]):
        self.collector = collector
        self.domains = domains
        self.spider_name = spider_name

    def collect(self) -> list[Metric]:
        return zero_filled(self.collector.collect(), spider=self.spider_name(), domains=self.domains())
