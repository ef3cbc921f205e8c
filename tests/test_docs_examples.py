"""The examples the docs show are files in ``docs/examples/``, included by the pages and run here.

Policy YAML goes through the policy loader, settings snippets through Scrapy's settings with the
add-on and our start-up validation, command lines through each command's own argument parser, and
the spider crawls the chaos site. A page cannot carry a copyable Python or YAML block of its own.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from scrapy.settings import Settings
from scrapy.utils.misc import load_object
from scrapy.utils.test import get_crawler

from scrapy_openclaw.distributed.scheduler import OpenClawRedisScheduler
from scrapy_openclaw.policy import PolicySet
from scrapy_openclaw.schedule.tasks import load_tasks
from scrapy_openclaw.settings import OpenClawSettings
from scrapy_openclaw.testing.crawl import run_crawl
from scrapy_openclaw.testing.presets import fault_free_site

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"
PAGES = {p: p.read_text(encoding="utf-8") for p in sorted(DOCS.rglob("*.md")) if "_build" not in p.parts}
sys.path.insert(0, str(DOCS / "_ext"))

import openclaw_refdata as refdata  # noqa: E402

POLICIES = ["openclaw.yaml", "ban_markers.yaml"]
SETTINGS = ["addon_line.py", "optional_settings.py", "checkpoint_settings.py", "durable_feeds_by_hand.py"]
DISTRIBUTED_SETTINGS = ["distributed_settings.py", "keep_scrapy_redis_pipeline.py"]
SPIDERS = ["deadlines_spider.py"]
COMMAND_LINES = ["dlq-commands.sh"]
OTHER = ["tasks.yaml", "prometheus.yml"]


def test_every_example_is_tested_here():
    assert sorted(p.name for p in EXAMPLES.iterdir() if p.is_file()) == sorted(
        POLICIES + SETTINGS + DISTRIBUTED_SETTINGS + SPIDERS + COMMAND_LINES + OTHER
    )


def _included() -> set[str]:
    names = set()
    for page, text in PAGES.items():
        for target in re.findall(r"```\{literalinclude\}\s+(\S+)", text):
            resolved = (page.parent / target).resolve()
            if resolved.parent == EXAMPLES.resolve():
                names.add(resolved.name)
    return names


def test_every_example_is_shown_on_a_page():
    assert sorted(p.name for p in EXAMPLES.iterdir() if p.is_file()) == sorted(_included())


@pytest.mark.parametrize("page", list(PAGES), ids=lambda p: str(p.relative_to(DOCS)))
def test_pages_have_no_copyable_code_of_their_own(page):
    """Python and YAML are included from docs/examples (run here), never written into a page."""
    blocks = re.findall(r"^ *```(python|py|yaml|yml|toml|\{code-block\}.*)\s*$", PAGES[page], re.M)
    assert not blocks


def _settings_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)


def test_the_readme_shows_the_examples_verbatim():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = _settings_blocks(readme)
    assert blocks
    files = {p.read_text(encoding="utf-8") for p in EXAMPLES.glob("*.py")}
    assert all(block in files for block in blocks)


# ------------------------------------------------------------------ policy and tasks files


@pytest.mark.parametrize("name", POLICIES)
def test_policy_example_loads_and_validates(name):
    policies = PolicySet.from_settings(Settings({"OPENCLAW_POLICY_FILE": str(EXAMPLES / name)}))
    shop = policies.for_domain("shop.example.com")
    assert shop.health.ban_markers == ('id="captcha-form"', "Please sign in to continue")
    assert shop.health.blocked_hold == 120


def test_the_example_policy_says_what_the_pages_say_it_does():
    policies = PolicySet.from_settings(Settings({"OPENCLAW_POLICY_FILE": str(EXAMPLES / "openclaw.yaml")}))
    api = policies.for_domain("api.example.com")
    assert api.retry.protocol_retryable.max_attempts == 10
    assert api.retry.protocol_retryable.jitter == "equal"  # a partial override keeps the class's other values
    assert api.deadline.classes == {"price": 300}
    assert api.health.base_rate == 2  # *.example.com applies under the exact host
    assert policies.for_domain("example.com").health.base_rate is None  # not a subdomain of itself
    assert policies.for_domain("other.org").health.circuit_failures == 5  # defaults


def test_tasks_example_loads():
    (task,) = load_tasks(EXAMPLES / "tasks.yaml")
    assert (task.id, task.spider, task.cron) == ("nightly", "products", "0 3 * * *")
    assert task.settings == {"CONCURRENT_REQUESTS": 4}
    assert task.args == {"category": "books"}


def test_prometheus_example_scrapes_the_port_the_settings_example_opens():
    config = yaml.safe_load((EXAMPLES / "prometheus.yml").read_text(encoding="utf-8"))
    (target,) = config["scrape_configs"][0]["static_configs"][0]["targets"]
    port = _namespace("optional_settings.py")["OPENCLAW_METRICS_PORT"]
    assert target == f"127.0.0.1:{port}"


# ------------------------------------------------------------------ settings snippets


def _namespace(name: str) -> dict:
    namespace: dict = {}
    exec(compile((EXAMPLES / name).read_text(encoding="utf-8"), name, "exec"), namespace)
    return {k: v for k, v in namespace.items() if k.isupper()}


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A Scrapy project directory (scrapy.cfg, the example policy beside it) as the working directory."""
    (tmp_path / "scrapy.cfg").write_text("[settings]\ndefault = shop.settings\n", encoding="utf-8")
    shutil.copy(EXAMPLES / "openclaw.yaml", tmp_path / "openclaw.yaml")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("name", SETTINGS)
def test_settings_example_starts_with_the_addon(name, project):
    snippet = _namespace(name)
    crawler = get_crawler(settings_dict={**_namespace("addon_line.py"), **snippet})
    config = OpenClawSettings.from_settings(crawler.settings)
    PolicySet.from_settings(crawler.settings)
    for key, value in snippet.items():
        if key.startswith("OPENCLAW_"):
            assert getattr(config, key.removeprefix("OPENCLAW_").lower()) == value
        elif isinstance(value, dict):  # component dicts: every class path imports, ours are in effect
            effective = crawler.settings.getwithbase(key)
            for path, order in value.items():
                load_object(path)
                assert effective[path] == order


def test_distributed_example_starts_distributed_mode(project):
    snippet = _namespace("distributed_settings.py")
    crawler = get_crawler(settings_dict=snippet)  # the tests' environment holds the shared OPENCLAW_STORE_KEY
    config = OpenClawSettings.from_settings(crawler.settings)
    assert config.distributed is True
    assert load_object(crawler.settings["SCHEDULER"]) is OpenClawRedisScheduler


def test_keeping_scrapy_redis_pipeline_keeps_it(project):
    from scrapy_redis.pipelines import RedisPipeline

    from scrapy_openclaw.distributed.pipelines import RedisItemPipeline

    snippet = {**_namespace("distributed_settings.py"), **_namespace("keep_scrapy_redis_pipeline.py")}
    crawler = get_crawler(settings_dict=snippet)
    pipelines = crawler.settings.getdict("ITEM_PIPELINES")
    enabled = [load_object(k) if isinstance(k, str) else k for k, v in pipelines.items() if v is not None]
    assert RedisPipeline in enabled and RedisItemPipeline not in enabled
    assert load_object(crawler.settings["SCHEDULER"]) is OpenClawRedisScheduler  # (distributed mode all the same)


# ------------------------------------------------------------------ command lines


def _parse(line: str) -> None:
    """A ``scrapy openclaw-*`` line as scrapy.cmdline reads it: the command's options, then its words."""
    words = shlex.split(line, comments=True)
    assert words[0] == "scrapy"
    name, rest = words[1], words[2:]
    command = refdata.command_classes()[name]()
    command.settings = Settings()
    parser = argparse.ArgumentParser(prog=f"scrapy {name}", add_help=False, exit_on_error=False)
    command.add_options(parser)
    try:
        _, args = parser.parse_known_args(rest)
    except (argparse.ArgumentError, SystemExit) as exc:
        raise AssertionError(f"{line}: {exc}") from None
    assert not [a for a in args if a.startswith("-")], f"{line}: unknown options"
    placeholder = re.match(r"\[?[A-Z][A-Z_]*\]?(\s|$)", command.syntax())  # (SPIDER: any word)
    if args and not placeholder:
        assert re.search(rf"(^|[\s|(\[]){re.escape(args[0])}($|[\s|)\]])", command.syntax()), f"{line}: {args[0]}?"


def _command_lines():
    for line in (EXAMPLES / "dlq-commands.sh").read_text(encoding="utf-8").splitlines():
        if line.strip():
            yield pytest.param(line, id=line[:60])
    for page, text in PAGES.items():
        for block in re.findall(r"^ *```(?:text|console|)\n(.*?)^ *```", text, re.M | re.S):
            for line in block.splitlines():
                line = line.strip().removeprefix("$ ")
                if line.startswith("scrapy openclaw-"):
                    yield pytest.param(line, id=f"{page.name}: {line[:50]}")


@pytest.mark.parametrize("line", list(_command_lines()))
def test_command_line_in_the_docs_parses(line):
    _parse(line)


def test_a_wrong_command_line_is_caught():
    with pytest.raises(AssertionError):
        _parse("scrapy openclaw-dlq list --no-such-option")
    with pytest.raises(AssertionError):
        _parse("scrapy openclaw-dlq lsit")


# ------------------------------------------------------------------ the spider


def test_deadlines_spider_crawls_the_chaos_site(chaos_server, tmp_path, monkeypatch):
    server = chaos_server(fault_free_site(n_hosts=1, pages=20))
    monkeypatch.setenv("PYTHONPATH", f"{EXAMPLES}:{ROOT}")
    result = run_crawl(
        spider="deadlines_spider.PricesSpider",
        settings={
            **_namespace("addon_line.py"),
            "OPENCLAW_POLICY": {"defaults": {"deadline": {"classes": {"price": 300}}}},
            "OPENCLAW_DLQ_URI": str(tmp_path / "dlq.jsonl"),
            "OPENCLAW_REPORT_ENABLED": False,
        },
        spider_args={"start_url": server.start_urls[0]},
        out_dir=tmp_path / "out",
        timeout=120,
    )
    assert result.returncode == 0, result.log[-3000:]
    served = server.truth()["hosts"]["127.0.0.2"]
    scraped = {item["url"] for item in result.items}
    assert len(scraped) == len(result.items) == served["statuses"]["200"] == served["total"]
    assert scraped == {served["base_url"].rstrip("/") + path for path in served["counts"]}
    # the start request carries its own deadline; every followed page took its request class's
    assert result.stats["openclaw/queue/deadline/defaulted"] == len(scraped) - 1
