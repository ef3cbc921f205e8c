"""A host-pattern rule: which domains it matches, and how specific it is (the order rules apply in).

``host.example.com`` matches itself only; ``*.example.com`` every subdomain
(not example.com); other wildcards go through :func:`fnmatch.fnmatchcase`.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class _Rule:
    pattern: str
    overrides: dict[str, Any]

    @property
    def specificity(self) -> tuple[int, int]:
        exact = "*" not in self.pattern
        return (1 if exact else 0, self.pattern.count("."))

    def matches(self, domain: str) -> bool:
        if "*" not in self.pattern:
            return domain == self.pattern
        if self.pattern.startswith("*.") and "*" not in self.pattern[2:]:
            return domain.endswith(self.pattern[1:])
        return fnmatch.fnmatchcase(domain, self.pattern)
