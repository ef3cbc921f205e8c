"""Site memory: the store (signed, bounded, aging, refusing what it did not write), the registry
started from it (and what a wrong memory costs, under an injected clock), the command, and the
goal on real crawls of the chaos site: a second crawl of a rate-limited site provokes at most one
429 per host, counted by the site itself."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from scrapy_openclaw.health.registry import OPEN, HealthRegistry
from scrapy_openclaw.health.registry.tuning import _SEED_PLATEAU
from scrapy_openclaw.sites.entry import SiteEntry, learned
from scrapy_openclaw.sites.store import FileSiteStore, RedisSiteStore, SiteStoreError
from scrapy_openclaw.testing.crawl import run_crawl
from scrapy_openclaw.testing.presets import rate_limited_site
from scrapy_openclaw.testing.servers import subprocess_env
from tests.projects import run_python
from tests.test_moving_limits import HTTP_429, T0, Limiter, answered_between, crawl

NOW = 1_800_000_000.0


def entry(seen_at: float = NOW, **kw: Any) -> SiteEntry:
    return SiteEntry(seen_at=seen_at, crawls=1, **kw)


# --------------------------------------------------------------------------- the store


def test_file_store_round_trip_private_and_signed(tmp_path: Path) -> None:
    store = FileSiteStore(tmp_path / "data" / "sites.json")
    saved = {"a.test": entry(limit=9.8, burst=4, signals={"429": 2, "retry_after": 2}), "b.test": entry(crawl_delay=2)}
    store.save(saved, now=NOW)
    assert store.load(now=NOW) == saved
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    data = json.loads(store.path.read_text())
    assert data["version"] == 1 and set(data["entries"]) == {"a.test", "b.test"}
    assert saved["a.test"].signal == "429 with Retry-After" and saved["b.test"].signal == "none"


def test_file_store_is_bounded_and_entries_age_out(tmp_path: Path) -> None:
    store = FileSiteStore(tmp_path / "sites.json", max_entries=3, max_age=100.0)
    store.save({f"d{i}.test": entry(seen_at=NOW + i) for i in range(5)}, now=NOW + 5)
    assert set(store.load(now=NOW + 5)) == {"d2.test", "d3.test", "d4.test"}  # the least recently seen dropped
    assert set(store.load(now=NOW + 103)) == {"d3.test", "d4.test"}  # d2 is now older than max_age
    store.save({"new.test": entry(seen_at=NOW + 200)}, now=NOW + 200)  # merges with what is there
    assert set(store.load(now=NOW + 200)) == {"new.test"}
    assert store.forget(["new.test", "other.test"]) == ["new.test"]


def _two_workers_save(store: Any) -> None:
    """Two workers of one crawl, both from the entry known at open, save periodically and at close."""
    known = {"a.test": entry(limit=10.0, signals={"429": 5, "retry_after": 5})}
    store.save(known, now=NOW)
    saved = [dict(known), dict(known)]  # what each worker last wrote (at first: what it read)
    for worker, counts in ((0, 3), (1, 4), (0, 6), (1, 4)):  # cumulative 429s each has seen
        mine = {
            "a.test": SiteEntry(
                seen_at=NOW, limit=9.0 + worker, crawls=2, signals={"429": 5 + counts, "retry_after": 5 + counts}
            )
        }
        store.save(mine, now=NOW + 1, saved=saved[worker])
        saved[worker] = mine
    merged = store.load(now=NOW + 1)["a.test"]
    # 5 known + 6 from one worker + 4 from the other: neither overwrote the other, nothing twice
    assert merged.signals == {"429": 15, "retry_after": 15}
    assert merged.crawls == 2 and merged.limit == 10.0  # one crawl; the newest reading of the limit


def test_workers_saving_one_domain_add_their_counts_in_a_file(tmp_path: Path) -> None:
    _two_workers_save(FileSiteStore(tmp_path / "sites.json"))


def test_workers_saving_one_domain_add_their_counts_in_redis(redis_server: Any) -> None:
    import redis

    _two_workers_save(RedisSiteStore(redis.Redis.from_url(redis_server.url), "chaos"))


class _SavesBetween:
    """A real Redis client whose next pipeline, once executed (a save's read), runs *between*
    first: another worker's save landing between this one's read and its write."""

    def __init__(self, client: Any, between: Any) -> None:
        self.client, self.between = client, between

    def pipeline(self, **kwargs: Any) -> Any:
        pipe = self.client.pipeline(**kwargs)
        run, self.between = self.between, None
        if run is not None:
            execute = pipe.execute

            def read_then_run() -> Any:
                out = execute()
                run()
                return out

            pipe.execute = read_then_run
        return pipe

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def test_a_save_landing_between_another_saves_read_and_write_is_not_lost(redis_server: Any) -> None:
    import redis

    client = redis.Redis.from_url(redis_server.url)
    known = {"a.test": entry(limit=10.0, signals={"429": 5})}
    RedisSiteStore(client, "chaos").save(known, now=NOW)

    def other_worker_saves() -> None:
        mine = {"a.test": entry(limit=9.0, signals={"429": 5 + 4})}
        assert RedisSiteStore(client, "chaos").save(mine, now=NOW + 1, saved=known) == mine

    mine = {"a.test": entry(limit=11.0, signals={"429": 5 + 3})}
    racing = RedisSiteStore(_SavesBetween(client, other_worker_saves), "chaos")
    assert racing.save(mine, now=NOW + 1, saved=known) == mine
    # 5 known + 3 + 4: the later write read the other's save again instead of overwriting it
    assert RedisSiteStore(client, "chaos").load(now=NOW + 1)["a.test"].signals == {"429": 12}


@pytest.mark.parametrize(
    "damage",
    ["forged", "torn", "version", "bad-field", "symlink"],
)
def test_a_damaged_or_hostile_file_is_refused(tmp_path: Path, damage: str) -> None:
    store = FileSiteStore(tmp_path / "sites.json")
    store.save({"a.test": entry(limit=10.0)}, now=NOW)
    data = json.loads(store.path.read_text())
    if damage == "forged":  # someone without the key raised the limit
        data["entries"]["a.test"]["limit"] = 1000.0
        store.path.write_text(json.dumps(data))
    elif damage == "torn":
        store.path.write_bytes(store.path.read_bytes()[:40])
    elif damage == "version":
        data["version"] = 2
        store.path.write_text(json.dumps(data))
    elif damage == "bad-field":
        from scrapy_openclaw.serialization import signing
        from scrapy_openclaw.sites.store import PURPOSE, _body

        data["entries"]["a.test"]["limit"] = "__import__('os')"
        data["mac"] = signing.current().mac(PURPOSE, _body(data["entries"]))
        store.path.write_text(json.dumps(data))
    else:
        target = tmp_path / "elsewhere.json"
        store.path.rename(target)
        store.path.symlink_to(target)
    with pytest.raises((SiteStoreError, ValueError)) as exc:
        store.load(now=NOW)
    assert str(store.path) in str(exc.value)


def test_redis_store_validates_what_it_reads(redis_server: Any) -> None:
    import redis

    client = redis.Redis.from_url(redis_server.url)
    store = RedisSiteStore(client, "chaos", max_entries=2)
    store.save({"a.test": entry(limit=5.0), "b.test": entry(seen_at=NOW + 1)}, now=NOW + 1)
    assert set(store.load(now=NOW + 1)) == {"a.test", "b.test"}
    assert client.ttl("chaos:sites:a.test") > 0  # it ages out on its own
    client.hset("chaos:sites:evil.test", mapping={"entry": b'{"limit": 1e9}', "mac": "0" * 32})
    problems: list[str] = []
    assert set(store.load(now=NOW + 1, problems=problems)) == {"a.test", "b.test"}
    assert len(problems) == 1 and "chaos:sites:evil.test" in problems[0]
    store.save({"c.test": entry(seen_at=NOW + 2)}, now=NOW + 2)  # over max_entries: the oldest go
    assert set(store.load(now=NOW + 2)) == {"b.test", "c.test"}
    assert client.exists("chaos:sites:a.test", "chaos:sites:evil.test") == 0  # (the unreadable one too)
    assert store.forget(None) == ["b.test", "c.test"]


# --------------------------------------------------------------------------- the registry


def test_a_remembered_domain_starts_at_its_limit_not_slow_start() -> None:
    reg = HealthRegistry()
    reg.remembered.remember("known.test", limit=39.2, burst=4, crawl_delay=0.0)
    known, stranger = reg.state("known.test", T0), reg.state("new.test", T0)
    resumed = 39.2  # (what a cut learned: already under the limit it fitted)
    assert known.rate == pytest.approx(resumed) and known.limit == pytest.approx(resumed) and known.limit_measured
    assert known.burst_cap == 4
    assert stranger.rate < known.rate and stranger.limit is None
    # on the plateau: a while later it still sends at the limit, not past it
    for i in range(200):
        reg.record_success("known.test", 0.01, now=T0 + i * 0.025)
    assert reg.state("known.test", T0 + 5).rate == pytest.approx(resumed, rel=0.01)
    delayed = HealthRegistry()
    delayed.remembered.remember("slow.test", limit=None, crawl_delay=2.0)
    assert delayed.state("slow.test", T0).crawl_delay == 2.0


def test_a_remembered_limit_is_held_through_its_longer_plateau_without_a_refusal() -> None:
    """The site still takes what memory says: no probe beyond it (and so no 429) for
    ``_SEED_PLATEAU`` seconds, the pace at the limit from the first second; then the cubic
    probes upward as after any cut, and its first 429 makes the domain an ordinary one."""
    reg = HealthRegistry()
    reg.remembered.remember("a", limit=9.8, burst=5)  # learned on a 10/s site (0.98 x its fit)
    reg, run = crawl(Limiter([(0.0, 10.0, 5)]), _SEED_PLATEAU + 15.0, concurrency=16, latency=0.02, registry=reg)
    first_refusal = next(at for at, ok in run.sent if not ok) - T0
    assert first_refusal > _SEED_PLATEAU  # (then it probed: a raised limit would be found)
    for second in range(int(_SEED_PLATEAU)):
        answered, _ = answered_between(run, second, second + 1)
        assert answered >= 9, (second, answered)  # at the remembered pace from the start
    assert reg.state("a").limit_measured and reg.state("a").limit != 9.8  # re-measured by that probe
    assert min(run.health) >= 50.0 and OPEN not in run.circuits


def test_a_limit_that_fell_is_refitted_without_health_collapse() -> None:
    reg = HealthRegistry()
    reg.remembered.remember("a", limit=20.0, burst=5)  # the site now takes 8/s
    reg, run = crawl(Limiter([(0.0, 8.0, 3)]), 40.0, registry=reg)
    _, refused_late = answered_between(run, 20.0, 40.0)
    answered_late, _ = answered_between(run, 20.0, 40.0)
    assert min(run.health) >= 50.0 and OPEN not in run.circuits  # slower, never sick
    assert reg.state("a").limit is not None and reg.state("a").limit <= 8.0 * 1.1  # re-fitted near the new limit
    assert answered_late >= 0.8 * 8.0 * 20.0  # and crawling at it
    assert refused_late <= 4


def test_a_remembered_limit_a_little_high_costs_one_429_not_half_the_pace() -> None:
    """A memory read a few per cent high meets its first 429 early in the crawl (the site's
    burst spent in a second): the cut reads the remembered pace in the delivered-rate window,
    not a half-empty first second, so the pace stays near the limit."""
    reg = HealthRegistry()
    reg.remembered.remember("a", limit=13.3, burst=1)  # resumed above the 12/s the site takes
    reg, run = crawl(Limiter([(0.0, 12.0, 1)]), 10.0, registry=reg)
    answered, refused = answered_between(run, 0.0, 10.0)
    assert run.sent[0][1] and refused <= 2
    assert answered >= 0.9 * 12.0 * 8.0  # (a second held by each Retry-After)
    assert min(run.health) >= 50.0 and OPEN not in run.circuits


def test_a_limit_that_rose_is_probed_upward() -> None:
    reg = HealthRegistry()
    reg.remembered.remember("a", limit=5.0, burst=2)  # the site now takes 20/s
    reg, run = crawl(Limiter([(0.0, 20.0, 5)]), 60.0, registry=reg)
    answered_late, _ = answered_between(run, 45.0, 60.0)
    assert answered_late >= 2 * 5.0 * 15.0  # well past the remembered pace
    assert min(run.health) >= 50.0 and OPEN not in run.circuits


def test_learned_keeps_a_limit_not_measured_again_and_replaces_a_remeasured_one() -> None:
    """What a crawl saves: the remembered limit while the domain still paces at it (its memory
    was not contradicted), the new one once a cut measured it again."""
    before = SiteEntry(limit=10.5, burst=4, seen_at=NOW, crawls=1)
    reg = HealthRegistry()
    reg.remembered.remember("a", limit=10.5, burst=4)
    resumed = reg.remembered.resumed_limit("a")
    kept = learned(reg.state("a", T0), None, banned=False, before=before, now=NOW + 1, resumed=resumed)
    assert kept.limit == 10.5 and kept.burst == 4 and kept.crawls == 2
    for i in range(50):  # at the remembered pace, then the site (10/s) refuses: a cut re-measures it
        reg.record_success("a", 0.01, now=T0 + i * 0.095)
    reg.record_failure("a", HTTP_429, now=T0 + 5.0, retry_after=1.0)
    state = reg.state("a", T0 + 5.0)
    assert state.limit_measured and state.limit is not None and state.limit < 10.5
    replaced = learned(state, None, banned=False, before=before, now=NOW + 1, resumed=resumed)
    assert replaced.limit == round(state.limit, 3)


def test_a_limit_the_site_says_is_remembered_with_how_it_says_it() -> None:
    """The pace a site declared in its RateLimit headers is kept (and shown) beside its
    refusals; a crawl that heard none keeps the last one said; a bad value is refused."""
    reg = HealthRegistry()
    reg.declare_limit("a", 12.0, now=T0)
    said = learned(reg.state("a", T0), None, banned=False, before=None, now=NOW)
    assert said.declared == 12.0 and said.limit == round(12.0 * 0.95, 3) and said.signal == "says 12/s"
    quiet = HealthRegistry()
    quiet.record_success("a", 0.01, now=T0)
    kept = learned(quiet.state("a", T0), None, banned=False, before=said, now=NOW + 1)
    assert kept.declared == 12.0 and kept.crawls == 2
    assert SiteEntry(declared=12.0, signals={"429": 1}).signal == "says 12/s, 429"
    assert SiteEntry.from_data(said.to_data(), "here") == said
    with pytest.raises(ValueError, match="field 'declared'"):
        SiteEntry.from_data({**said.to_data(), "declared": "fast"}, "here")


# --------------------------------------------------------------------------- crawls


def crawl_settings(store: Path, enabled: bool = True) -> dict[str, Any]:
    return {
        "ADDONS": {"scrapy_openclaw.Addon": 100},
        "OPENCLAW_SITES_ENABLED": enabled,
        "OPENCLAW_SITES_PATH": str(store),
        "OPENCLAW_REPORT_ENABLED": False,
        "OPENCLAW_DLQ_URI": str(store.parent / "dl.jsonl"),  # (nothing written into the checkout)
        "OPENCLAW_SNAPSHOT_DIR": str(store.parent / "snapshots"),
        "DOWNLOAD_TIMEOUT": 5,
    }


def test_a_second_crawl_provokes_at_most_one_429_per_host(chaos_server: Any, tmp_path: Path) -> None:
    site = chaos_server(rate_limited_site(n_hosts=3, rate=10.0, burst=5, pages=100))
    store = tmp_path / "sites.json"
    first = run_crawl(settings=crawl_settings(store), spider_args={"start_urls": site.start_urls}, timeout=240)
    assert first.stats.get("finish_reason") == "finished", first.log[-3000:]
    first_429 = {h: t["statuses"].get("429", 0) for h, t in site.truth(include_requests=False)["hosts"].items()}
    assert all(n > 1 for n in first_429.values()), first_429  # a stranger crosses the limit to find it
    remembered = FileSiteStore(store).load()
    assert set(remembered) == set(first_429)
    assert all(e.limit is not None and 5.0 <= e.limit <= 12.0 for e in remembered.values()), remembered
    assert first.stats["openclaw/sites/saved"] == 3

    site.reset()
    second = run_crawl(settings=crawl_settings(store), spider_args={"start_urls": site.start_urls}, timeout=240)
    assert second.stats.get("finish_reason") == "finished", second.log[-3000:]
    truth = site.truth(include_requests=False)["hosts"]
    second_429 = {h: t["statuses"].get("429", 0) for h, t in truth.items()}
    assert all(n <= 1 for n in second_429.values()), (second_429, first_429)
    assert len(second.items) == len(first.items) == len(site.reachable().ok)
    assert second.stats["openclaw/sites/known"] == 3
    assert "3 domain(s) known, 3 start at their remembered pace" in second.log
    after = FileSiteStore(store).load()
    for host in remembered:
        assert after[host].crawls == 2
    # a host not measured again keeps the limit remembered, never a share of it (a host whose
    # memory read high met its one 429 and was re-measured: test_learned_keeps_..._replaces_...)
    unmeasured = [host for host in remembered if second_429[host] == 0]
    assert all(after[host].limit == remembered[host].limit for host in unmeasured), unmeasured


def test_a_hostile_store_is_one_warning_and_the_crawl_goes_on(chaos_server: Any, tmp_path: Path) -> None:
    site = chaos_server(rate_limited_site(n_hosts=1, rate=50.0, burst=10, pages=10))
    store = tmp_path / "sites.json"
    store.write_text(json.dumps({"version": 1, "mac": "0" * 32, "entries": {"127.0.0.2": {"limit": 0.001}}}))
    result = run_crawl(settings=crawl_settings(store), spider_args={"start_urls": site.start_urls}, timeout=120)
    assert result.stats.get("finish_reason") == "finished", result.log[-3000:]
    warnings = [line for line in result.log.splitlines() if "Ignoring the site memory" in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0] and "seal does not match" in warnings[0]
    assert "Traceback" not in result.log
    assert len(result.items) == len(site.reachable().ok)
    assert FileSiteStore(store).load()["127.0.0.2"].crawls == 1  # replaced by this crawl's own


def test_memory_is_saved_while_the_crawl_runs(chaos_server: Any, tmp_path: Path) -> None:
    import time

    from scrapy_openclaw.testing.crawl import read_result, start_crawl
    from scrapy_openclaw.testing.presets import crawl_delay_site
    from scrapy_openclaw.testing.servers import stop_process

    site = chaos_server(crawl_delay_site(pages=8, crawl_delay=1.0))
    store = tmp_path / "sites.json"
    settings = {**crawl_settings(store), "ROBOTSTXT_OBEY": True, "OPENCLAW_SITES_SAVE_INTERVAL": 0.5}
    proc = start_crawl(settings=settings, spider_args={"start_urls": site.start_urls}, out_dir=tmp_path / "out")
    seen_running = None
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline and seen_running is None:
            if store.exists():
                seen_running = FileSiteStore(store).load()
            time.sleep(0.05)
        proc.wait(120)
    finally:
        stop_process(proc)
    result = read_result(tmp_path / "out", proc.returncode)
    assert result.stats.get("finish_reason") == "finished", result.log[-3000:]
    assert seen_running, "no save before the crawl ended"  # (a periodic save: the crawl was still running)
    assert seen_running["127.0.0.2"].crawl_delay == 1.0
    assert "Site memory: 1 domain(s) saved" in result.log  # and the one at close


# --------------------------------------------------------------------------- the command


def scrapy_sites(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``scrapy openclaw-sites ARGS``; the command is made known through an entry point on the
    child's path when this checkout's is not the one installed."""
    env = subprocess_env()
    from importlib.metadata import entry_points

    if "openclaw-sites" not in {e.name for e in entry_points(group="scrapy.commands")}:
        dist = cwd / "_ep" / "openclaw_sites_checkout-0.dist-info"
        dist.mkdir(parents=True, exist_ok=True)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: openclaw-sites-checkout\nVersion: 0\n")
        (dist / "entry_points.txt").write_text(
            "[scrapy.commands]\nopenclaw-sites = scrapy_openclaw.commands.sites:Command\n"
        )
        env["PYTHONPATH"] = f"{cwd / '_ep'}{os.pathsep}{env['PYTHONPATH']}"
    return run_python("-m", "scrapy", "openclaw-sites", *args, cwd=cwd, env=env)


@pytest.mark.crawl  # runs a subprocess
def test_command_lists_shows_and_forgets(tmp_path: Path) -> None:
    (tmp_path / "scrapy.cfg").write_text("[settings]\n")
    store = FileSiteStore(tmp_path / "openclaw-data" / "sites.json")  # the default place
    store.save(
        {
            "a.test": entry(seen_at=NOW + 1, limit=9.8, burst=4, signals={"429": 3, "retry_after": 3}, latency=0.012),
            "b.test": entry(crawl_delay=2.0, bans=True),
        },
        now=NOW + 1,
    )
    listed = scrapy_sites(tmp_path, "list")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:3] == ["domain", "limit/s", "burst"]
    assert lines[1].split()[:5] == ["a.test", "9.8", "4", "-", "429"]
    assert lines[2].split()[:5] == ["b.test", "-", "-", "2s", "none"]
    shown = scrapy_sites(tmp_path, "show", "a.test")
    assert json.loads(shown.stdout) == {
        "domain": "a.test",
        **store.load()["a.test"].to_data(),
        "signal": "429 with Retry-After",
    }
    assert scrapy_sites(tmp_path, "show", "c.test").returncode == 1
    assert scrapy_sites(tmp_path, "forget", "a.test").stdout.strip() == "forgot 1 domain(s)"
    assert set(store.load()) == {"b.test"}
    assert scrapy_sites(tmp_path, "forget", "--all").stdout.strip() == "forgot 1 domain(s)"
    assert scrapy_sites(tmp_path, "list").stdout.strip().startswith("no sites remembered")
    store.path.write_text("{not json")
    damaged = scrapy_sites(tmp_path, "list")
    assert damaged.returncode == 1 and damaged.stdout.startswith(f"error: {store.path}: not JSON")
    assert "Traceback" not in damaged.stderr


def test_distributed_workers_share_the_memory_in_redis(chaos_server: Any, redis_server: Any, tmp_path: Path) -> None:
    """Two workers learn the limits, keep them in Redis; once the crawl's own state is gone
    (queue and health hashes deleted, the memory kept), two new workers start at them."""
    import importlib.util

    import redis

    spec = importlib.util.spec_from_file_location(
        "openclaw_bench_distributed_sites", Path(__file__).resolve().parents[1] / "benchmarks" / "distributed.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    # (a limit a busy machine's crawl still crosses more than once: 5 req/s per host)
    site = chaos_server(rate_limited_site(n_hosts=2, rate=5.0, burst=5, pages=60))
    settings = {
        **bench.ours_defaults(redis_server.url),
        "OPENCLAW_SITES_ENABLED": True,
        "OPENCLAW_REPORT_ENABLED": False,
        "OPENCLAW_DLQ_URI": str(tmp_path / "dl.jsonl"),
    }
    client = redis.Redis.from_url(redis_server.url)
    counts = []
    for run in ("first", "second"):
        workers = bench.Workers(2, settings, site.start_urls, tmp_path / run)
        assert workers.wait(240) == [0, 0], workers.log(0)[-3000:] + workers.log(1)[-3000:]
        truth = site.truth(include_requests=False)["hosts"]
        counts.append({h: t["statuses"].get("429", 0) for h, t in truth.items()})
        assert sum(bench.scraped_urls(redis_server.url).values()) == len(site.reachable().ok)
        memory = RedisSiteStore(client, "chaos").load()
        assert set(memory) == set(truth) and all(e.limit is not None for e in memory.values()), memory
        # the 429s both workers met, added up: what the site sent, over both runs so far
        assert {h: e.signals.get("429", 0) for h, e in memory.items()} == {
            h: sum(c[h] for c in counts) for h in truth
        }, counts
        for key in client.scan_iter():
            if not key.startswith(b"chaos:sites:"):
                client.delete(key)
        site.reset()
    first, second = counts
    assert all(n > 1 for n in first.values()), first
    assert all(n <= 1 for n in second.values()), (second, first)
    assert any("2 domain(s) known, 2 start at their remembered pace" in workers.log(i) for i in range(2))
    listed = scrapy_sites(tmp_path, "list", "--redis", "chaos", "-s", f"REDIS_URL={redis_server.url}")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert sorted(line.split()[0] for line in listed.stdout.splitlines()[1:]) == sorted(first)
    gone = scrapy_sites(tmp_path, "forget", "--all", "--redis", "chaos", "-s", f"REDIS_URL={redis_server.url}")
    assert gone.stdout.strip() == "forgot 2 domain(s)" and not list(client.scan_iter(match="chaos:sites:*"))
