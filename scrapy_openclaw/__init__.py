"""scrapy-openclaw: make Scrapy crawls survive the real internet."""

from scrapy_openclaw.addon import Addon
from scrapy_openclaw.errors import ErrorClass
from scrapy_openclaw.exceptions import ItemValidationError, OpenClawConfigError, OpenClawError, ParseError

__all__ = ["Addon", "ErrorClass", "ItemValidationError", "OpenClawConfigError", "OpenClawError", "ParseError"]
__version__ = "0.2.0"  # the one place; pyproject.toml reads it (dynamic version)
