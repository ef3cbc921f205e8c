"""The controller's constants: circuit states, verdicts, and the tuning of pace, latency and 5xx windows.

One table for both controllers: the Lua port in :mod:`scrapy_openclaw.distributed.lua`
is sent every ``_NAME`` here as ``k_name`` (:func:`lua_constants`), so a constant is
declared once and the two cannot drift apart.
"""

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"
#: Verdicts of :meth:`HealthRegistry.judge`.
DOMAIN = "domain"
PAGE = "page"

SNAPSHOT_VERSION = 1
_LATENCY_ALPHA = 0.2  # weight of a new sample in the latency EWMA
_BASELINE_DRIFT = 0.01  # how fast the best-latency baseline follows a lasting change
_LATENCY_SLACK = 0.05  # seconds; latency noise below this is never congestion
# Successes before latency may signal congestion: the baseline of the first few (connection
# set-up, a crawl's start-up when every domain begins at once) is not the site's own.
_LATENCY_WARMUP = 20
_MIN_DECREASE_GAP = 1.0  # seconds between two multiplicative decreases (or one RTT if longer)
_SLOW_START_GAIN = 0.5  # slow start: the rate grows by this share with every success ...
_SLOW_START_DOUBLING = 0.1  # ... but doubles at most once per this many seconds (from initial_rate)
_PROBE_GROWTH = 1.5  # after the first cut the rate grows by this factor per second ...
_MAX_PROBE_SECONDS = 30.0  # ... (a bound for the exponent)
#: seconds of hold a probe's refusal may bring before the plateau grows slower in proportion
#: (a probe costs its hold: Retry-After 2 s, probes half as often, the same share of time lost)
_PROBE_HOLD = 1.0
_BEYOND = 1.02  # past this x the learned limit with answers clean, the limit has moved: probe at _PROBE_GROWTH
_CUT_AGAIN = 5  # 429s to requests sent after a cut that make another before _MIN_DECREASE_GAP
_CUT_FLOOR = 0.5  # a cut after the first keeps at least this share of the rate (a guard against a bad window)
# A block, not a limit (pacing.dry): a limiter's refusals that let nothing through for this many
# seconds, this many gaps at the learned limit, this many times the last hold (and this many
# answers' latency more) refuse everything (a temporary block, a spent fixed window, a quota):
# they halve the pace but leave the learned limit, so that answers coming back resume near it.
_DRY_SECONDS = 2.0
_DRY_GAPS = 4.0
_DRY_HOLDS = 2.0
_DRY_LATENCIES = 2.0
# A success that raises the pace more than this many times over (the first answer after a block)
# wakes the queues: a domain parked at the block's slow pace would wait out its old gap first.
_WAKE_RISE = 2.0
_MAX_RATE = 100000.0  # req/s; at this rate pacing has stopped mattering ("unpaced")
_BURST_SECONDS = 0.25  # the token bucket holds at most this much time's worth of requests
# The limit fit (limitfit.py): the history's bins and span, ...
_FIT_BIN = 0.01  # seconds
# seconds kept (trimmed back to this once half as long again): long enough to hold the last probe's
# 429 episode when the next probe is refused (a hard limit is probed every 18 s at Retry-After: 1,
# every 25-32 s at 2-3 s), so that its cut is fitted, not read off the window (at 20 s a probe at
# Retry-After: 2 cost two refusal episodes, the second 6 s after a cut learned 8% over the limit)
_FIT_HORIZON = 40.0
_FIT_BURN_IN = 5.0  # seconds at the start of a trimmed history whose 429s are not judged
_FIT_EPISODE_GAP = 1.0  # seconds between 429s of two episodes (a fit needs two)
# A history begun where a hold has just refilled the bucket is judged at once (W = 0 is known
# there, not guessed): a Retry-After hold at least this long (seconds) refills it; ...
_FIT_FULL_HOLD = 1.0
# ... and a limit that fell is fitted from the hold after its first refusal under the learned
# limit, when that came at most this long (seconds) before the refusal that says it fell
_FALL_LOOKBACK = 3.0
_FIT_HORIZON_BINS = round(_FIT_HORIZON / _FIT_BIN)  # (the same, in bins)
_FIT_BURN_IN_BINS = round(_FIT_BURN_IN / _FIT_BIN)
_FIT_EPISODE_BINS = round(_FIT_EPISODE_GAP / _FIT_BIN)
_FALL_LOOKBACK_BINS = round(_FALL_LOOKBACK / _FIT_BIN)
# ... the search: rates guess x STEP**k for k in LOW..HIGH (the window reads 0-8% high on a
# plateau, up to ~10% low at the end of the probe, when the rate was still rising), then
# REFINE halvings of the last step ...
_FIT_STEP = 1.02
_FIT_LOW = -12
_FIT_HIGH = 6
_FIT_REFINE = 4
# ... the fit is the top (the first fit, from two episodes: the middle) of the highest band of
# rates under the highest consistent one, and within this share of it, at which a whole burst
# explains the history, to this share of a token, each band's edges found by so many halvings, trying so
# many bursts from the least the highest consistent rate allows ...
_FIT_WHOLE_RANGE = 1.3
_FIT_WHOLE_SLACK = 0.1
_FIT_WHOLE_BISECT = 12
_FIT_WHOLE_BURSTS = 3
# ... while a bin drains no more than this many tokens at that rate (20 req/s with 10 ms bins):
# the history's times are whole bins, so past it a whole burst is no finer than the bins
_FIT_WHOLE_BIN_DRAIN = 0.2
# ... and the share of the fitted limit a cut keeps as the learned limit
_FIT_MARGIN = 0.98
# A limit site memory remembers is resumed as it was learned (already under the fitted limit)
# and held this long before the first probe beyond it: a limit an earlier crawl measured is
# better evidence than one a single 429 measured, so a repeat crawl's start costs no refusal.
_SEED_PLATEAU = 30.0  # seconds
_RESUMED = 3  # a record's ``cuts`` while it paces at a remembered limit (until its first cut)
# A pace the site declares (RateLimit headers) is kept at this share of it: requests that leave
# evenly spaced arrive bunched (network, concurrency), and a bucket at its limit refuses the bunch.
_DECLARED_SHARE = 0.95
_WINDOW = 1.0  # seconds; the delivered-rate estimate is the last such window and the open one
_STALE_WINDOW = 5.0  # a window longer than this (an idle domain) says nothing about its rate
# 5xx share of recent fresh answers: a fast and a slow EWMA (about the last 5 and 50);
# a 5xx is a domain signal when the fast share reaches the trigger and exceeds the
# slow baseline by the margin (failures clustering while successes stop). A 503
# window trips it at its 6th failure; one broken page in five, on about 4% of
# 100-page crawls (a run of bad luck), and then for one failure.
_SHARE_FAST = 0.2
_SHARE_SLOW = 0.02
_SHARE_TRIGGER = 0.7
_SHARE_MARGIN = 0.25
# Refusals that are no rate signal (refusals.py): answers per pace interval, ...
_PACE_SAMPLE = 10
_PACE_SHORT = 5  # ... or this many, once the interval lasted _PACE_SPAN seconds (a slow pace), ...
_PACE_SPAN = 2.0
# Slow start's answers are the reference with this many when a request sent after a refused one
# got through: a server refusing the third request leaves four when answers come fast, while a
# token bucket refuses slow start's last requests, not one in the middle.
_PACE_FEW = 4
_FLAT_MIN_SHARE = 0.2  # ... the refused share below which an interval is clean ...
_FLAT_SLOWER = 0.7  # ... a later interval at most this share of the reference's pace ...
_FLAT_KEPT = 0.7  # ... that kept at least this share of its refused share ...
_FLAT_DELIVERED = 0.85  # ... while what got through fell to at most this share of the reference's ...
_FLAT_PACE_SLACK = (
    0.15  # ... and to at most the pace's own fall plus this (a bucket's saved-up burst is no flat share) ...
)
_FLAT_MIN_OK = 3  # ... with at least this many successes: pace-independent refusals
_FLAT_RISE = 1.5  # x the flat share (+ _FLAT_MIN_SHARE): refused share that makes them a rate signal again
_FLAT_RISE_CAP = 0.9  # ... or this share, whichever is less (past a flat share of 0.47 the rule above could never fire)
# A rate signal (a 429, or an answer with Retry-After) says "slower", not "sick": it never
# takes health below this (nor below circuit_floor) and never opens the circuit.
_RATE_HEALTH_FLOOR = 50.0
_PROBE_RECHECK = 1.0  # seconds; how soon to ask again while a half-open probe is out
# A half-open probe that has not reported back after this long (and after the
# cool-down) was lost on the way (e.g. dropped by another middleware): allow another.
_PROBE_LOST_AFTER = 30.0
_MAX_DOUBLINGS = 32  # 2**32 x any cool-down is far past any cap


def lua_constants() -> dict[str, float]:
    """The numbers above as the Lua port reads them from its policy: ``_PROBE_GROWTH`` as ``k_probe_growth``."""
    return {
        f"k{name.lower()}": value
        for name, value in globals().items()
        if name[:1] == "_" and name[1:2].isalpha() and name.isupper() and isinstance(value, (int, float))
    }
