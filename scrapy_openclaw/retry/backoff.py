"""Exponential backoff with jitter, as small callables.

Retried after the same delay, requests that failed together (a 503 window) come
back together; the strategies of the AWS analysis "Exponential Backoff and Jitter"
spread them (docs/retry.md, "Backoff"). Each is a frozen dataclass that takes its
random source as ``uniform(a, b)``, so tests can pin it and no time has to pass.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from scrapy_openclaw.policy import RetryClassPolicy

Uniform = Callable[[float, float], float]

# Beyond this exponent base·2ⁿ overflows nothing but is far past any cap.
_MAX_EXPONENT = 62


class Backoff(Protocol):
    """A wait strategy: seconds to wait before retry number ``attempt`` (0-based).

    ``previous`` is the delay used last time, or None (only ``decorrelated`` uses it).
    """

    def __call__(self, attempt: int, previous: float | None = None) -> float: ...


def exponential(base: float, cap: float, attempt: int) -> float:
    """``min(cap, base·2^attempt)``, safe for any attempt number."""
    if attempt < 0:
        raise ValueError(f"attempt must be >= 0, got {attempt}")
    if base <= 0 or cap <= 0:
        return 0.0
    return min(cap, base * 2.0 ** min(attempt, _MAX_EXPONENT))


def _check(base: float, cap: float) -> None:
    if base < 0 or cap < 0:
        raise ValueError(f"backoff base and cap must be >= 0, got base={base}, cap={cap}")


@dataclass(frozen=True)
class NoJitter:
    base: float
    cap: float

    def __post_init__(self) -> None:
        _check(self.base, self.cap)

    def __call__(self, attempt: int, previous: float | None = None) -> float:
        return exponential(self.base, self.cap, attempt)


@dataclass(frozen=True)
class FullJitter:
    base: float
    cap: float
    uniform: Uniform = field(default=random.uniform, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check(self.base, self.cap)

    def __call__(self, attempt: int, previous: float | None = None) -> float:
        return self.uniform(0.0, exponential(self.base, self.cap, attempt))


@dataclass(frozen=True)
class EqualJitter:
    base: float
    cap: float
    uniform: Uniform = field(default=random.uniform, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check(self.base, self.cap)

    def __call__(self, attempt: int, previous: float | None = None) -> float:
        half = exponential(self.base, self.cap, attempt) / 2.0
        return half + self.uniform(0.0, half)


@dataclass(frozen=True)
class DecorrelatedJitter:
    base: float
    cap: float
    uniform: Uniform = field(default=random.uniform, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check(self.base, self.cap)

    def __call__(self, attempt: int, previous: float | None = None) -> float:
        if self.base <= 0 or self.cap <= 0:
            return 0.0
        prev = self.base if previous is None or previous < self.base else previous
        return min(self.cap, self.uniform(self.base, prev * 3.0))


STRATEGIES: dict[str, type] = {
    "full": FullJitter,
    "equal": EqualJitter,
    "decorrelated": DecorrelatedJitter,
    "none": NoJitter,
}


def make_backoff(jitter: str, base: float, cap: float, *, uniform: Uniform | None = None) -> Backoff:
    """The strategy named *jitter* (``full``, ``equal``, ``decorrelated``, ``none``)."""
    try:
        cls = STRATEGIES[jitter]
    except KeyError:
        known = ", ".join(sorted(STRATEGIES))
        raise ValueError(f"unknown jitter mode {jitter!r} (known: {known})") from None
    if cls is NoJitter:
        return NoJitter(base, cap)
    return cls(base, cap, uniform) if uniform is not None else cls(base, cap)


def for_policy(policy: RetryClassPolicy, *, uniform: Uniform | None = None) -> Backoff:
    """The strategy a per-class retry policy asks for."""
    return make_backoff(policy.jitter, policy.base_delay, policy.max_delay, uniform=uniform)
