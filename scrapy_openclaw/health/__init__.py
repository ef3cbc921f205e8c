"""Adaptive per-domain health: scoring, AIMD rate control, circuit breaking, Retry-After holds.

``HealthRegistry`` owns the state of every domain; ``DomainHealthMiddleware``
feeds it from responses and applies it to Scrapy's download slots.
"""

from scrapy_openclaw.health.ban import BanDetectionMiddleware
from scrapy_openclaw.health.middleware import DomainHealthMiddleware
from scrapy_openclaw.health.registry import DomainState, HealthRegistry

__all__ = ["BanDetectionMiddleware", "DomainHealthMiddleware", "DomainState", "HealthRegistry"]
