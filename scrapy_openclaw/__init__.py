"""scrapy-openclaw: make Scrapy crawls survive the real internet."""

from scrapy_openclaw.addon import Addon
from scrapy_openclaw.errors import ErrorClass, ItemValidationError, OpenClawConfigError, ParseError

__all__ = ["Addon", "ErrorClass", "ItemValidationError", "OpenClawConfigError", "ParseError"]
__version__ = "0.1.0"
