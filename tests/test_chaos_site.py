"""The chaos site really misbehaves as configured: proved from its ground truth."""

from __future__ import annotations

import http.client
import itertools
import json
import re
import threading
import time
from collections import deque
from typing import Any
from urllib.parse import urlsplit

import pytest
import pytest_twisted

from scrapy_openclaw.testing.chaos import (
    ROBOTS_PATH,
    ChaosConfig,
    ChaosSite,
    FailWindows,
    HostConfig,
    busiest_second_bounds,
    max_in_window,
    page_links,
    reachable_urls,
)
from scrapy_openclaw.testing.crawl import run_crawl
from scrapy_openclaw.testing.presets import (
    crawl_delay_site,
    fast_site,
    fault_free_site,
    flaky_site,
    hol_site,
    limit_sweep_site,
    mixed_failures_site,
    page_urls,
    queueing_site,
    rate_limited_site,
)
from scrapy_openclaw.testing.servers import refused_base_url

A, B, C = "127.0.0.2", "127.0.0.3", "127.0.0.4"
HREF = re.compile(r'href="([^"]+)"')


def one_host(**kwargs: Any) -> ChaosConfig:
    return ChaosConfig(hosts=(HostConfig(address=A, **kwargs),))


def fetch(url: str, *, timeout: float = 10.0, method: str = "GET") -> tuple[int, dict[str, str], str]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request(method, parts.path or "/")
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        conn.close()


def records(server: Any, address: str = A) -> list[dict[str, Any]]:
    return server.truth()["hosts"][address]["requests"]


def wait_for(predicate: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


# --------------------------------------------------------------------------- config and graph


def test_config_round_trips_through_json_and_validates() -> None:
    for config in (
        flaky_site(),
        rate_limited_site(),
        fault_free_site(),
        hol_site(),
        mixed_failures_site(),
        limit_sweep_site(),
        fast_site(),
        crawl_delay_site(),
        queueing_site(),
    ):
        assert ChaosConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    built = HostConfig(
        address=A,
        fail_windows={"period": 2, "down": 1},
        parse_fail={"3": 1},
        status_script={"4": [503, 200]},
        not_found=[5],
    )
    assert built.fail_windows == FailWindows(period=2, down=1)
    assert built.parse_fail == {3: 1} and built.status_script == {4: (503, 200)}
    with pytest.raises(ValueError, match="127.0.0.2.*drop_rate"):
        HostConfig(address=A, drop_rate=2.0)
    with pytest.raises(ValueError, match="capacity"):
        HostConfig(address=A, capacity=0)
    with pytest.raises(ValueError, match="fail_windows"):
        HostConfig(address=A, fail_windows={"period": 1.0, "down": 2.0})
    with pytest.raises(ValueError, match="unique"):
        ChaosConfig(hosts=(HostConfig(address=A), HostConfig(address=A)))


def test_presets_shape() -> None:
    flaky = flaky_site(n_hosts=4, pages=40)
    assert [h.address for h in flaky.hosts] == [A, B, C, "127.0.0.5"]
    for host in flaky.hosts:
        assert host.fail_windows is not None
        assert host.fail_windows.down / host.fail_windows.period == pytest.approx(0.3)
        assert 0 < host.drop_rate < 0.1 and 0 < host.hang_rate < 0.1
        assert host.not_found and host.parse_fail
    assert len({h.fail_windows.offset for h in flaky.hosts if h.fail_windows}) == 4
    limited = rate_limited_site(n_hosts=3, rate=10, burst=5)
    assert all(h.rate_limit and (h.rate_limit.rate, h.rate_limit.burst) == (10, 5) for h in limited.hosts)
    hol = hol_site(fast_hosts=8, slow_hosts=2, slow_latency=1.5)
    assert [h.latency for h in hol.hosts] == [0.0] * 8 + [1.5] * 2
    assert len({h.address for h in hol.hosts}) == 10


def test_issue_15_presets_shape() -> None:
    mixed = mixed_failures_site(pages=200)
    healthy, broken = mixed.hosts
    assert not healthy.status_script and not healthy.not_found
    assert sorted(broken.status_script) == list(range(5, 200, 5))
    assert set(broken.status_script.values()) == {(503,)} and 0 not in broken.status_script
    assert broken.not_found and not set(broken.not_found) & set(broken.status_script)
    reach = reachable_urls(mixed, {A: "http://a/", B: "http://b/"})
    assert len(reach.ok) > 300 and 30 < len(reach.failing) < 50
    assert all(url.startswith("http://b/") for url in reach.failing)
    sweep = limit_sweep_site(limits=(3, 12, 40, 60, 150), seconds=20)
    assert [h.pages for h in sweep.hosts] == [60, 240, 800, 1200, 3000]
    assert [(h.rate_limit.rate, h.rate_limit.burst, h.rate_limit.retry_after) for h in sweep.hosts if h.rate_limit] == [
        (3, 2, "1"),
        (12, 3, "1"),
        (40, 10, "1"),
        (60, 15, "1"),
        (150, 15, "1"),
    ]
    fast = fast_site(pages=5000)
    assert len(fast.hosts) == 1 and fast.hosts[0].latency == 0 and fast.hosts[0].links_per_page == "all"
    assert "Crawl-delay: 2\n" in (crawl_delay_site().hosts[0].robots_txt or "")
    assert page_urls("http://dead.test/", 2) == ["http://dead.test/page/0", "http://dead.test/page/1"]


def test_link_graph_is_deterministic() -> None:
    config = fault_free_site(n_hosts=3, pages=30, cross_links=2, seed=7)
    again = fault_free_site(n_hosts=3, pages=30, cross_links=2, seed=7)
    other = fault_free_site(n_hosts=3, pages=30, cross_links=2, seed=8)
    graph = [page_links(config, h, p) for h in range(3) for p in range(30)]
    assert graph == [page_links(again, h, p) for h in range(3) for p in range(30)]
    assert graph != [page_links(other, h, p) for h in range(3) for p in range(30)]
    for h in range(3):
        for p in range(30):
            links = page_links(config, h, p)
            same_host = [t for (o, t) in links if o == h]
            assert len(links) == 5 + 2 and len(same_host) >= 5
            assert p not in same_host[:5] and len(set(same_host[:5])) == 5


def test_served_links_follow_the_seed(chaos_server: Any) -> None:
    config = fault_free_site(n_hosts=2, pages=10, cross_links=1, seed=3)
    first, second = chaos_server(config), chaos_server(config)

    def paths(server: Any, page: int) -> list[tuple[str, str]]:
        body = fetch(server.urls[A] + f"page/{page}")[2]
        hosts = {urlsplit(u).netloc: a for a, u in server.urls.items()}
        return [(hosts[urlsplit(h).netloc], urlsplit(h).path) for h in HREF.findall(body)]

    for page in range(10):
        served = paths(first, page)
        assert served == paths(second, page)
        expected = [(config.hosts[h].address, f"/page/{p}") for h, p in page_links(config, 0, page)]
        assert served == expected


def test_reachable_with_all_links_is_exact() -> None:
    config = one_host(pages=6, links_per_page="all", not_found=[2], status_script={4: [503, 404], 5: [503, 200]})
    base = "http://127.0.0.2:1234/"
    result = reachable_urls(config, {A: base})
    assert result.ok == {base, base + "page/1", base + "page/3", base + "page/5"}
    assert result.failing == {base + "page/2", base + "page/4"}


def test_reachable_matches_an_http_bfs(chaos_server: Any) -> None:
    config = ChaosConfig(
        hosts=(
            HostConfig(address=A, pages=25, links_per_page=2, cross_links=1, not_found=[3, 7]),
            HostConfig(address=B, pages=25, links_per_page=1, cross_links=1, not_found=[1]),
        ),
        seed=5,
    )
    server = chaos_server(config)
    queue = deque(server.start_urls)
    seen = set(queue)
    ok, failing = set(), set()
    for _ in range(500):
        if not queue:
            break
        url = queue.popleft()
        status, _, body = fetch(url)
        (ok if status == 200 else failing).add(url)
        for link in HREF.findall(body):
            if link not in seen:
                seen.add(link)
                queue.append(link)
    assert not queue
    expected = server.reachable()
    assert (ok, failing) == (set(expected.ok), set(expected.failing))
    assert failing and len(ok) > 10


# --------------------------------------------------------------------------- faults


def test_latency_delays_every_answer(chaos_server: Any) -> None:
    server = chaos_server(one_host(latency=0.3, latency_jitter=0.2))
    for _ in range(3):
        started = time.monotonic()
        assert fetch(server.urls[A])[0] == 200
        assert time.monotonic() - started >= 0.3 * 0.98
    served = records(server)
    assert [r["status"] for r in served] == [200] * 3
    assert all(r["end"] - r["t"] >= 0.3 * 0.98 for r in served)


def test_fail_windows_follow_the_server_clock(chaos_server: Any) -> None:
    windows = FailWindows(period=1.0, down=0.4, status=503, offset=0.25)
    server = chaos_server(one_host(fail_windows=windows))
    seen = []
    deadline = time.monotonic() + 2.2
    while time.monotonic() < deadline:
        seen.append(fetch(server.urls[A] + "page/1")[0])
        time.sleep(0.02)
    truth = server.truth()
    served = truth["hosts"][A]["requests"]
    assert [r["status"] for r in served] == seen
    for r in served:
        assert r["status"] == (503 if windows.is_down(r["t"] - truth["started_at"]) else 200)
    assert {503, 200} <= set(seen)


def test_a_first_request_clock_starts_the_windows_at_the_first_request(chaos_server: Any) -> None:
    """A crawl that starts late (a busy machine) still meets a window "from the start"."""
    windows = FailWindows(period=1000.0, down=1.0, status=503)
    config = ChaosConfig(hosts=(HostConfig(address=A, fail_windows=windows),), clock="first_request")
    server = chaos_server(config)
    assert server.truth(include_requests=False)["started_at"] is None  # nothing asked yet
    time.sleep(1.5)  # (longer than the window: a "start" clock would answer 200 now)
    first = fetch(server.urls[A] + "page/1")[0]
    truth = server.truth()
    served = truth["hosts"][A]["requests"]
    assert first == 503 and truth["started_at"] == served[0]["t"]
    with pytest.raises(ValueError, match="clock"):
        ChaosConfig(hosts=(HostConfig(address=A),), clock="noon")


@pytest.mark.parametrize("retry_after", ["soon", "-5", "99999999", "Wed, 21 Oct 2015 07:28:00 GMT", "2", None])
def test_429_carries_the_exact_retry_after(chaos_server: Any, retry_after: str | None) -> None:
    server = chaos_server(one_host(rate_limit={"rate": 0.1, "burst": 2, "retry_after": retry_after}))
    answers = [fetch(server.urls[A]) for _ in range(3)]
    assert [a[0] for a in answers] == [200, 200, 429]
    assert answers[2][1].get("Retry-After") == retry_after
    assert server.truth()["hosts"][A]["statuses"] == {"200": 2, "429": 1}


def test_token_bucket_allows_burst_then_rate(chaos_server: Any) -> None:
    rate, burst = 4.0, 3
    server = chaos_server(one_host(rate_limit={"rate": rate, "burst": burst}))
    statuses = [fetch(server.urls[A])[0] for _ in range(24)]
    assert statuses[:burst] == [200] * burst
    assert 429 in statuses
    served = records(server)
    elapsed = served[-1]["t"] - served[0]["t"]
    assert statuses.count(200) <= burst + rate * elapsed + 1
    time.sleep(0.75)  # refills ~3 tokens
    assert [fetch(server.urls[A])[0] for _ in range(2)] == [200, 200]


def test_a_scheduled_limit_drops_at_its_second(chaos_server: Any) -> None:
    config = one_host(rate_limit={"rate": 1000.0, "burst": 5, "schedule": [[1.0, 0.01, 1]]})
    limit = ChaosConfig.from_dict(json.loads(json.dumps(config.to_dict()))).hosts[0].rate_limit
    assert limit is not None and limit.at(0.99) == (1000.0, 5) and limit.at(1.0) == (0.01, 1)
    server = chaos_server(config)
    assert [fetch(server.urls[A])[0] for _ in range(5)] == [200] * 5
    started = server.truth(include_requests=False)["started_at"]
    time.sleep(max(0.0, started + 1.1 - time.time()))
    # the bucket shrinks to 1 token that refills at 0.01 req/s: one answer, then refusals
    assert [fetch(server.urls[A])[0] for _ in range(3)] == [200, 429, 429]


def test_a_scheduled_limit_rises_at_its_second(chaos_server: Any) -> None:
    server = chaos_server(one_host(rate_limit={"rate": 0.01, "burst": 1, "schedule": [[1.0, 1000.0, 5]]}))
    assert [fetch(server.urls[A])[0] for _ in range(2)] == [200, 429]
    started = server.truth(include_requests=False)["started_at"]
    time.sleep(max(0.0, started + 1.1 - time.time()))
    assert [fetch(server.urls[A])[0] for _ in range(5)] == [200] * 5
    served = records(server)
    assert all(r["status"] == 200 for r in served if r["t"] >= started + 1.0)


def test_a_limiter_may_answer_503_with_retry_after(chaos_server: Any) -> None:
    server = chaos_server(one_host(rate_limit={"rate": 0.1, "burst": 1, "status": 503, "retry_after": "2"}))
    answers = [fetch(server.urls[A]) for _ in range(2)]
    assert [a[0] for a in answers] == [200, 503]
    assert answers[1][1].get("Retry-After") == "2"


def test_every_nth_request_is_refused_however_slowly(chaos_server: Any) -> None:
    server = chaos_server(one_host(rate_limit={"rate": 0, "every": 3, "retry_after": None}))
    statuses = []
    for _ in range(6):
        statuses.append(fetch(server.urls[A])[0])
        time.sleep(0.2)  # far slower than any bucket of this config would need
    assert statuses == [200, 200, 429, 200, 200, 429]
    assert "Retry-After" not in fetch(server.urls[A])[1]


def test_a_fixed_window_refuses_past_its_quota_and_says_the_rest(chaos_server: Any) -> None:
    # 3 requests a minute (0.05 req/s), counted in fixed windows; Retry-After says the window's rest
    server = chaos_server(one_host(rate_limit={"rate": 0.05, "window": 60.0, "retry_after": "{rest}"}))
    answers = [fetch(server.urls[A]) for _ in range(4)]
    assert [a[0] for a in answers] == [200, 200, 200, 429]
    assert 1 <= int(answers[3][1]["Retry-After"]) <= 60


def test_a_fixed_windows_count_starts_again_with_the_next_window() -> None:
    from scrapy_openclaw.testing.chaos import ChaosSite

    site = ChaosSite(one_host(rate_limit={"rate": 2.0, "window": 1.0, "schedule": [[2.0, 0.0, 1]]}))
    host = site._hosts[0]  # (the limiter's own arithmetic, at the seconds given: no clock involved)
    assert [host._take_token(0.1 + i / 100) for i in range(3)] == [True, True, False]
    assert [host._take_token(1.5 + i / 100) for i in range(3)] == [True, True, False]
    assert not host._take_token(2.5)  # (a rate of 0 from 2 s: a block)


def test_rate_limit_rejects_a_bad_schedule() -> None:
    with pytest.raises(ValueError, match="in order"):
        one_host(rate_limit={"rate": 1, "schedule": [[5, 1, 1], [2, 1, 1]]})
    with pytest.raises(ValueError, match="burst >= 1"):
        one_host(rate_limit={"rate": 1, "schedule": [[5, 1, 0]]})
    with pytest.raises(ValueError, match="4xx/5xx"):
        one_host(rate_limit={"rate": 1, "status": 200})
    with pytest.raises(ValueError, match="window >= 0"):
        one_host(rate_limit={"rate": 1, "window": -1})


def test_dropped_connections_get_no_response(chaos_server: Any) -> None:
    server = chaos_server(one_host(drop_rate=1.0))
    for _ in range(3):
        with pytest.raises(ConnectionError):  # RemoteDisconnected or ConnectionResetError
            fetch(server.urls[A])
    host = server.truth()["hosts"][A]
    assert host["statuses"] == {"drop": 3}
    assert wait_for(lambda: server.truth()["hosts"][A]["in_flight"] == 0)


def test_hanging_requests_never_answer(chaos_server: Any) -> None:
    server = chaos_server(one_host(hang_rate=1.0))
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        fetch(server.urls[A], timeout=0.5)
    assert time.monotonic() - started >= 0.45
    assert server.truth()["hosts"][A]["statuses"] == {"hang": 1}
    # The client gave up and closed: the server notices and cleans up.
    assert wait_for(lambda: server.truth()["hosts"][A]["in_flight"] == 0)
    assert records(server)[0]["end"] is not None


def test_a_host_with_capacity_serves_in_turn(chaos_server: Any) -> None:
    """``capacity=1``: four clients at once are served one after the other (answers slow
    down, none is refused); a client that gives up while in line frees its place."""
    server = chaos_server(one_host(latency=0.2, capacity=1))
    ended: list[float] = []
    started = time.monotonic()

    def client() -> None:
        fetch(server.urls[A], timeout=10)
        ended.append(time.monotonic() - started)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert len(ended) == 4 and max(ended) >= 4 * 0.2 * 0.98
    served = records(server)
    assert [r["status"] for r in served] == [200] * 4
    # one at a time, by the server's own record: each answer took its 0.2 s and began
    # only after the one before it ended (a busy machine only stretches these)
    spans = sorted((r["t"] + r["wait"], r["end"]) for r in served)
    assert all(end - start >= 0.2 * 0.98 for start, end in spans), spans
    assert all(b[0] >= a[1] - 1e-3 for a, b in zip(spans, spans[1:])), spans
    # in flight (served or in line) at most: as many as the record's spans overlap (four when
    # all four arrived before the first answer; a late starter on a busy machine makes it fewer)
    events = sorted([(r["t"], 1) for r in served] + [(r["end"], -1) for r in served], key=lambda e: (e[0], e[1]))
    overlap = max(itertools.accumulate(step for _, step in events))
    assert server.truth()["hosts"][A]["max_in_flight"] == overlap >= 1
    # a client that leaves the line is forgotten: the next one is served at once
    blocker = threading.Thread(target=fetch, args=(server.urls[A],), daemon=True)
    blocker.start()
    assert wait_for(lambda: server.truth()["hosts"][A]["in_flight"] == 1)
    with pytest.raises(TimeoutError):
        fetch(server.urls[A], timeout=0.05)
    blocker.join(10)
    assert wait_for(lambda: server.truth()["hosts"][A]["in_flight"] == 0)
    assert fetch(server.urls[A])[0] == 200
    assert records(server)[-1]["wait"] < 0.2  # not in line behind the one that left (one answer)


def test_stop_drops_hanging_connections(chaos_server: Any) -> None:
    server = chaos_server(one_host(hang_rate=1.0))
    errors: list[BaseException] = []

    def client() -> None:
        try:
            fetch(server.urls[A], timeout=30)
        except BaseException as exc:  # recorded for the assertion
            errors.append(exc)

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    assert wait_for(lambda: server.truth()["hosts"][A]["in_flight"] == 1)
    server.stop()
    thread.join(10)
    assert not thread.is_alive()
    assert server.returncode == 0
    assert len(errors) == 1 and isinstance(errors[0], ConnectionError)


def test_not_found_pages_and_unknown_paths(chaos_server: Any) -> None:
    server = chaos_server(one_host(pages=5, not_found=[2]))
    base = server.urls[A]
    assert fetch(base + "page/2")[0] == 404
    assert fetch(base + "page/5")[0] == 404
    assert fetch(base + "robots.txt")[0] == 404
    assert fetch(base + "page/1")[0] == 200
    assert 'href="' + base + "page/" in fetch(base)[2]
    host = server.truth()["hosts"][A]
    assert host["counts"] == {"/page/2": 1, "/page/5": 1, "/robots.txt": 1, "/page/1": 1, "/": 1}
    assert host["statuses"] == {"404": 3, "200": 2}


def test_robots_txt_is_served_and_recorded_apart(chaos_server: Any) -> None:
    robots = "User-agent: *\nCrawl-delay: 2\n"
    server = chaos_server(
        ChaosConfig(hosts=(HostConfig(address=A, pages=3, robots_txt=robots), HostConfig(address=B, pages=3)))
    )
    status, headers, body = fetch(server.urls[A] + "robots.txt")
    assert (status, body) == (200, robots) and headers["Content-Type"].startswith("text/plain")
    assert fetch(server.urls[B] + "robots.txt")[0] == 404  # not configured: an unknown path
    assert fetch(server.urls[A] + "page/1")[0] == 200
    assert [r["path"] for r in records(server)] == [ROBOTS_PATH, "/page/1"]
    assert server.truth()["hosts"][A]["counts"] == {ROBOTS_PATH: 1, "/page/1": 1}


def test_redirects_meta_refresh_auth_cookies_sizes_and_images(chaos_server: Any) -> None:
    """The answers Scrapy's own middlewares deal with (redirects, auth, cookies, sizes, images)."""
    server = chaos_server(
        one_host(
            pages=6,
            redirects={1: 2},
            meta_refresh={3: 4},
            page_sizes={5: 5000},
            basic_auth="ann:secret",
            set_cookie="session=abc",
        )
    )
    parts = urlsplit(server.urls[A])

    def get(path: str, **headers: str) -> http.client.HTTPResponse:
        conn = http.client.HTTPConnection(str(parts.hostname), parts.port, timeout=10)
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        response.read()
        conn.close()
        return response

    denied = get("/page/1")
    assert denied.status == 401 and denied.getheader("WWW-Authenticate") == 'Basic realm="chaos"'
    assert get("/robots.txt").status == 404  # robots.txt needs no credentials
    auth = {"Authorization": "Basic YW5uOnNlY3JldA=="}
    moved = get("/page/1", **auth, Cookie="session=abc")
    assert (moved.status, moved.getheader("Location")) == (302, "/page/2")
    assert moved.getheader("Set-Cookie") == "session=abc; Path=/"
    status, _, body = fetch_with(server.urls[A] + "page/3", auth)
    assert status == 200 and 'http-equiv="refresh" content="0; url=/page/4"' in body
    assert len(fetch_with(server.urls[A] + "page/5", auth)[2]) == 5000
    assert len(fetch_with(server.urls[A] + "page/4", auth)[2]) < 1000
    image = get("/image/7.png", **auth)
    assert image.status == 200 and image.getheader("Content-Type") == "image/png"
    cookies = [r.get("cookie") for r in records(server)]
    assert cookies.count("session=abc") == 1


def fetch_with(url: str, headers: dict[str, str]) -> tuple[int, dict[str, str], str]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(str(parts.hostname), parts.port, timeout=10)
    try:
        conn.request("GET", parts.path, headers=headers)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        conn.close()


def test_pages_broken_for_good(chaos_server: Any) -> None:
    server = chaos_server(mixed_failures_site(pages=20, not_found=(7,)))
    base = server.urls[B]
    assert [fetch(base + "page/5")[0] for _ in range(4)] == [503] * 4
    assert [fetch(base + "page/7")[0] for _ in range(2)] == [404] * 2
    assert fetch(base)[0] == fetch(base + "page/0")[0] == fetch(base + "page/6")[0] == 200
    assert fetch(server.urls[A] + "page/5")[0] == 200


def test_refused_base_url_refuses_connections() -> None:
    url = refused_base_url("127.0.0.254")
    assert re.fullmatch(r"http://127\.0\.0\.254:\d+/", url)
    with pytest.raises(ConnectionRefusedError):
        fetch(url + "page/1", timeout=5)


def test_parse_fail_pages_recover(chaos_server: Any) -> None:
    server = chaos_server(one_host(pages=5, parse_fail={1: 2}))
    bodies = [fetch(server.urls[A] + "page/1") for _ in range(3)]
    assert [b[0] for b in bodies] == [200, 200, 200]
    assert ['id="title"' in b[2] for b in bodies] == [False, False, True]
    assert 'id="title"' in fetch(server.urls[A] + "page/2")[2]


def test_status_script_sequence(chaos_server: Any) -> None:
    server = chaos_server(one_host(pages=5, status_script={1: [503, 503, 200], 2: [500, 429]}))
    base = server.urls[A]
    assert [fetch(base + "page/1")[0] for _ in range(4)] == [503, 503, 200, 200]
    assert [fetch(base + "page/2")[0] for _ in range(3)] == [500, 429, 429]
    # Reset restarts the scripts and clears the truth; control paths are never recorded.
    server.reset()
    assert server.truth()["hosts"][A]["total"] == 0
    assert fetch(base + "page/1")[0] == 503
    assert fetch(base + "__reset__")[0] == 405
    assert server.truth()["hosts"][A]["counts"] == {"/page/1": 1}


def test_probabilistic_faults_are_reproducible(chaos_server: Any) -> None:
    server = chaos_server(one_host(drop_rate=0.4, status_script={}))

    def run() -> list[Any]:
        for _ in range(20):
            try:
                fetch(server.urls[A] + "page/1")
            except ConnectionError:
                pass
        return [r["status"] for r in records(server)]

    first = run()
    server.reset()
    assert run() == first
    assert {"drop", 200} == set(first)


# --------------------------------------------------------------------------- load statistics


def test_max_in_window() -> None:
    assert max_in_window([]) == 0
    assert max_in_window([0, 0.5, 0.99, 1.0, 1.5, 1.6]) == 4
    assert max_in_window([0, 1, 2, 3]) == 1
    assert max_in_window([5, 5, 5], window=0.1) == 3


def test_busiest_second_bounds_allow_each_request_its_send_slack() -> None:
    arrivals = [0.0, 0.6, 1.2, 1.3, 3.0]
    # busiest 0.5 s holds 2 (1.2, 1.3); busiest 1.5 s holds 4 (0.0 .. 1.3)
    assert busiest_second_bounds(arrivals) == (2, 4)
    assert busiest_second_bounds(arrivals, slack=0.0) == (max_in_window(arrivals),) * 2


def test_rate_and_concurrency_statistics(chaos_server: Any) -> None:
    config = ChaosConfig(hosts=(HostConfig(address=A, latency=1.0), HostConfig(address=B)))
    server = chaos_server(config)
    threads = [threading.Thread(target=fetch, args=(server.urls[A],), daemon=True) for _ in range(6)]
    for thread in threads:
        thread.start()
    for _ in range(8):
        fetch(server.urls[B])
    time.sleep(1.1)
    for _ in range(3):
        fetch(server.urls[B])
    for thread in threads:
        thread.join(20)
    truth = server.truth()
    slow, fast = truth["hosts"][A], truth["hosts"][B]
    # Max in-flight equals the overlap of the recorded [t, end] intervals.
    events = sorted([(r["t"], 1) for r in slow["requests"]] + [(r["end"], -1) for r in slow["requests"]])
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    assert slow["max_in_flight"] == peak and 2 <= peak <= 6
    assert fast["max_in_flight"] == 1
    assert fast["max_1s_window"] == max_in_window(r["t"] for r in fast["requests"])
    assert fast["max_1s_window"] >= 3 and fast["total"] == 11


# --------------------------------------------------------------------------- in process


@pytest_twisted.inlineCallbacks
def test_in_process_site_on_the_running_reactor() -> Any:
    """Whatever reactor the test run installed: serve, report truth, and stop with a hang open."""
    from twisted.internet import defer, protocol, reactor, task
    from twisted.web.client import Agent, ResponseDone, ResponseNeverReceived

    def read_body(response: Any) -> Any:
        # Not twisted's readBody: in Twisted 26.10 it warns (DeprecationWarning) on Agent responses.
        done: Any = defer.Deferred()
        chunks: list[bytes] = []

        class Collect(protocol.Protocol):
            def dataReceived(self, data: bytes) -> None:
                chunks.append(data)

            def connectionLost(self, reason: Any = None) -> None:
                if reason.check(ResponseDone):
                    done.callback(b"".join(chunks))
                else:
                    done.errback(reason)

        response.deliverBody(Collect())
        return done

    config = ChaosConfig(hosts=(HostConfig(address=A, pages=3), HostConfig(address=B, hang_rate=1.0)))
    site = ChaosSite(config)
    urls = site.start()
    agent = Agent(reactor)
    try:
        response = yield agent.request(b"GET", urls[A].encode())
        assert response.code == 200
        assert b'<h1 id="title">Page 0 on 127.0.0.2</h1>' in (yield read_body(response))
        response = yield agent.request(b"GET", (urls[B] + "__truth__").encode())
        served = json.loads((yield read_body(response)))
        assert served["hosts"][A]["statuses"] == {"200": 1}
        assert served["hosts"][A] == json.loads(json.dumps(site.truth()))["hosts"][A]
        hanging = agent.request(b"GET", urls[B].encode())
        for _ in range(200):
            if site.truth()["hosts"][B]["in_flight"]:
                break
            yield task.deferLater(reactor, 0.02, lambda: None)
        assert site.truth()["hosts"][B]["statuses"] == {"hang": 1}
    finally:
        yield site.stop()
    with pytest.raises(ResponseNeverReceived):
        yield hanging
    assert site.truth()["hosts"][B]["in_flight"] == 0


# --------------------------------------------------------------------------- a real crawl


def test_real_crawl_scrapes_every_reachable_page(chaos_server: Any, tmp_out: Any) -> None:
    server = chaos_server(fault_free_site(n_hosts=2, pages=15, cross_links=1))
    result = run_crawl(spider_args={"start_urls": server.start_urls}, out_dir=tmp_out, timeout=90)
    assert result.returncode == 0, result.log[-3000:]
    assert result.stats["finish_reason"] == "finished"
    urls = [item["url"] for item in result.items]
    assert len(urls) == len(set(urls))
    assert set(urls) == set(server.reachable().ok)
    assert {item["host"] for item in result.items} == {A, B}
    counts = {a: h["counts"] for a, h in server.truth()["hosts"].items()}
    assert sum(sum(c.values()) for c in counts.values()) == len(urls)


def test_crawl_obeying_robots_txt_fetches_it_once_per_host(chaos_server: Any, tmp_out: Any) -> None:
    server = chaos_server(crawl_delay_site(pages=4, crawl_delay=0.2))
    result = run_crawl(
        settings={"ROBOTSTXT_OBEY": True}, spider_args={"start_urls": server.start_urls}, out_dir=tmp_out, timeout=90
    )
    assert result.stats.get("finish_reason") == "finished", result.log[-3000:]
    assert {item["url"] for item in result.items} == set(server.reachable().ok)
    reqs = records(server)
    assert [r["path"] for r in reqs].count(ROBOTS_PATH) == 1 and reqs[0]["path"] == ROBOTS_PATH
    assert result.stats["robotstxt/response_status_count/200"] == 1
    assert len([r for r in reqs if r["path"] != ROBOTS_PATH]) == len(result.items)
