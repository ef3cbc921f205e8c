"""Warnings that a hostile or broken peer can repeat at will, condensed so they cannot flood the log.

The first warning of a kind (a key such as ``("malformed Retry-After", domain)``)
is logged; the same kind again within ``every`` seconds is only counted, and
the count rides on the next warning of that kind or on :meth:`summarise` at
close. Memory is bounded: past ``max_keys`` kinds the oldest are forgotten.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from typing import Any

#: Events remembered per kind, to tell a new event from the same one told again.
RECENT_EVENTS = 16
#: Kinds remembered at once (a broad crawl meets many domains; each costs a few dozen bytes).
MAX_KEYS = 10000


class CondensedWarnings:
    """Log the first warning of each kind, count the repeats, report the count later."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        every: float = 60.0,
        max_keys: int = MAX_KEYS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.logger = logger
        self.every = math.inf if every <= 0 else every
        self.max_keys = max_keys
        self.clock = clock
        # key -> [logged at, repeats, last message, its args, recent events]
        self._kinds: OrderedDict[Hashable, list[Any]] = OrderedDict()

    def warn(self, key: Hashable, message: str, args: dict[str, Any], *, same: Any = None, **kwargs: Any) -> bool:
        """Log *message* % *args* unless a warning of kind *key* was logged less than ``every`` seconds
        ago (then count it); True when logged. Repeats counted since are appended to the line.

        *same* (not None) identifies the event: the same event told again (several readers of one
        answer's header) is neither logged nor counted twice.
        """
        now = self.clock()
        seen = self._kinds.get(key)
        if same is not None and seen is not None:
            if same in seen[4]:
                return False
            seen[4].append(same)
        if seen is not None and now - seen[0] < self.every:
            seen[1] += 1
            seen[2], seen[3] = message, args
            return False
        repeats = seen[1] if seen is not None else 0
        if repeats:
            line = message + " (%(condensed_repeats)d more like it since the last such warning)"
            self.logger.warning(line, {**args, "condensed_repeats": repeats}, **kwargs)
        else:
            self.logger.warning(message, args, **kwargs)
        recent = seen[4] if seen is not None else deque(maxlen=RECENT_EVENTS)
        if seen is None and same is not None:
            recent.append(same)
        self._kinds[key] = [now, 0, message, args, recent]
        self._kinds.move_to_end(key)
        while len(self._kinds) > self.max_keys:
            self._kinds.popitem(last=False)
        return True

    def summarise(self, **kwargs: Any) -> int:
        """One line per kind with repeats not yet reported (at close); how many lines."""
        lines = 0
        for key, (_, repeats, message, args, _recent) in list(self._kinds.items()):
            if repeats:
                self.logger.warning(
                    "%(repeats)d more warnings like this one were not logged: " + message,
                    {**args, "repeats": repeats},
                    **kwargs,
                )
                self._kinds[key][1] = 0
                lines += 1
        return lines
