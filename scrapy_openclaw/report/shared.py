"""Distributed mode: every worker's figures in one report, through Redis.

Counts add up, so each worker stores its own part at close and a report merges the
parts. The busiest second does not: each worker hands its new send-time bins to a
Lua script (:data:`_SCRIPT`) every few seconds, which keeps the busiest windows
across all workers. Keys and lifetime: docs/politeness-report.md.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from scrapy_openclaw.distributed.connection import reply_text, run_scripts
from scrapy_openclaw.metrics.peaks import RESOLUTION, WINDOWS
from scrapy_openclaw.report.model import merge, validate

if TYPE_CHECKING:
    from scrapy_openclaw.metrics.figures import CrawlFigures

TTL = 7 * 86400  # seconds the shared report keys live after the last write
PUSH_INTERVAL = 5.0  # seconds between two hand-overs of a worker's send times
_WIDTHS = [int(round(w / RESOLUTION)) for w in WINDOWS]
#: Merge one worker's new send-time bins of a domain, keep the busiest windows across workers
#: (one call per domain with new sends; bins older than the horizon are final and dropped).
_SCRIPT = """
-- Merge one worker's new send-time bins of a domain and keep the busiest windows across workers.
-- KEYS[1]: the domain's bins hash (bin -> requests), KEYS[2]: the peaks hash ("<domain>\\t<width>" -> best)
-- ARGV[1]: domain, ARGV[2]: bins before this one are final (deleted after this pass),
-- ARGV[3]: TTL (s) of both keys, ARGV[4]: n windows, ARGV[5 .. 4+n]: window widths (bins),
-- then pairs: bin, requests.
local nw = tonumber(ARGV[4])
local flat = redis.call('HGETALL', KEYS[1])
local keys, counts = {}, {}
for i = 1, #flat, 2 do
  local k = tonumber(flat[i])
  keys[#keys + 1] = k
  counts[k] = tonumber(flat[i + 1])
end
local changed = {}  -- (one HSET for all the new bins, not a HINCRBY each)
for i = 5 + nw, #ARGV, 2 do
  local k, n = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  if counts[k] == nil then
    keys[#keys + 1] = k
    counts[k] = 0
  end
  counts[k] = counts[k] + n
  changed[#changed + 1] = string.format('%d', k)
  changed[#changed + 1] = counts[k]
end
if #changed > 0 then redis.call('HSET', KEYS[1], unpack(changed)) end
table.sort(keys)
local fields, bests = {}, {}
for w = 1, nw do
  local width = tonumber(ARGV[4 + w])
  local best, total, lo = 0, 0, 1
  for hi = 1, #keys do
    total = total + counts[keys[hi]]
    while keys[hi] - keys[lo] >= width do
      total = total - counts[keys[lo]]
      lo = lo + 1
    end
    if total > best then best = total end
  end
  fields[w], bests[w] = ARGV[1] .. '\\t' .. ARGV[4 + w], best
end
local stored = redis.call('HMGET', KEYS[2], unpack(fields))
local better = {}
for w = 1, nw do
  if bests[w] > tonumber(stored[w] or '0') then
    better[#better + 1] = fields[w]
    better[#better + 1] = bests[w]
  end
end
if #better > 0 then redis.call('HSET', KEYS[2], unpack(better)) end
local final, old = tonumber(ARGV[2]), {}
for _, k in ipairs(keys) do
  if k < final then old[#old + 1] = string.format('%d', k) end
end
for i = 1, #old, 1000 do redis.call('HDEL', KEYS[1], unpack(old, i, math.min(i + 999, #old))) end
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return #keys
"""


class SharedReport:
    """The Redis side of one crawl's report; calls block, so run them off the reactor thread."""

    def __init__(self, server: Any, spider: str, scope: str):
        self.server = server
        self.base = f"{spider}:report:{{{scope}#report}}"
        self._script = server.register_script(_SCRIPT)

    def key(self, name: str) -> str:
        return f"{self.base}:{name}"

    def push_bins(self, fresh: dict[str, dict[int, int]], horizon: float, now: float | None = None) -> None:
        """Add each domain's new bins (*fresh*: domain -> bin -> requests) to the shared ones: a
        script call per domain, in one pipeline (one round trip; per node on a cluster)."""
        now = time.time() if now is None else now
        final = int((now - horizon - 2 * PUSH_INTERVAL) / RESOLUTION) - max(_WIDTHS)
        calls = []
        for domain, bins in fresh.items():
            pairs = [str(x) for kv in sorted(bins.items()) for x in kv]
            args = [domain, final, TTL, len(_WIDTHS), *_WIDTHS, *pairs]
            calls.append((self._script, [self.key(f"bins:{domain}"), self.key("peaks")], args))
        for ok, res in run_scripts(self.server, calls) if calls else ():
            if not ok:
                raise res

    def peaks(self) -> dict[str, dict[str, int]]:
        """domain -> {"busiest_1s": n, "busiest_5s": n} across every worker."""
        names = dict(zip(_WIDTHS, ("busiest_1s", "busiest_5s")))
        out: dict[str, dict[str, int]] = {}
        for field, value in self.server.hgetall(self.key("peaks")).items():
            domain, _, width = reply_text(field).rpartition("\t")
            if width.isdigit() and int(width) in names:
                out.setdefault(domain, {})[names[int(width)]] = int(value)
        return out

    def store_part(self, worker: str, part: dict[str, Any]) -> None:
        key = self.key("parts")
        pipe = self.server.pipeline(transaction=False)  # (one round trip; one slot on a cluster)
        pipe.hset(key, worker, json.dumps(part))
        pipe.expire(key, TTL)
        pipe.execute()

    def merged(self) -> dict[str, Any]:
        """Every stored part merged, with the shared busiest windows; parts that are not reports
        (a damaged or hostile entry) are left out."""
        parts = []
        for worker, raw in self.server.hgetall(self.key("parts")).items():
            try:
                parts.append(validate(json.loads(raw), f"Redis {self.key('parts')} {reply_text(worker)}"))
            except ValueError:
                continue
        return merge(parts, self.peaks())


def fresh_bins(figures: CrawlFigures) -> dict[str, dict[int, int]]:
    """Each domain's bins added since the last call (and forget them here)."""
    out = {}
    for domain, f in figures.domains.items():
        bins = f.peaks.take_fresh()
        if bins:
            out[domain] = dict(bins)
    return out
