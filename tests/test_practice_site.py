"""``python -m scrapy_openclaw.testing.chaos`` with no config serves the documented practice site."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request

from scrapy_openclaw.testing.chaos.practice import HOSTS
from scrapy_openclaw.testing.servers import subprocess_env

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _ctrl_c_as_in_a_terminal() -> None:
    """A run started in the background (``cmd &``, nohup, some CI runners) inherits SIGINT
    ignored, and then Ctrl+C (SIGINT) stops nothing: give the child a terminal's default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_no_config_starts_the_practice_site_and_says_how_to_use_and_stop_it() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "scrapy_openclaw.testing.chaos", "--port", "0", "--max-seconds", "120"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=subprocess_env(),
        text=True,
        preexec_fn=_ctrl_c_as_in_a_terminal,
    )
    try:
        assert proc.stdout is not None
        banner = []
        for line in proc.stdout:
            banner.append(line)
            if line.startswith("Stop it with Ctrl+C"):
                break
        text = "".join(banner)
        assert f"kill {proc.pid}" in text, text
        urls = next(line for line in banner if line.startswith("START_URLS=")).strip().split("=", 1)[1].split(",")
        assert [u.split("/")[2].split(":")[0] for u in urls] == [address for address, _, _ in HOSTS]
        assert "scrapy crawl NAME -a start_urls=" + ",".join(urls) in text
        with _OPENER.open(urls[0], timeout=10) as response:  # the healthy host answers
            assert response.status == 200 and b"/page/" in response.read()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_port_in_use_is_one_line_naming_the_way_out() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.2", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "scrapy_openclaw.testing.chaos", "--port", str(port), "--max-seconds", "5"],
            capture_output=True,
            text=True,
            env=subprocess_env(),
            timeout=60,
        )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: cannot listen on 127.0.0.2:{port}")
    assert "try --port 0" in result.stderr
