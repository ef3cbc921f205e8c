"""Live control of a running crawl: an HTTP API on the metrics port, a Redis channel, ``scrapy openclaw-ctl``."""

from scrapy_openclaw.control.controller import COMMANDS, ControlError, Controller, validate

__all__ = ["COMMANDS", "ControlError", "Controller", "validate"]
