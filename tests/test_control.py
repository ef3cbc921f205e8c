"""Live control, unit level: command validation, overrides in the HealthRegistry, the CLI's parsing and output."""

from __future__ import annotations

import argparse
import logging
import math

import pytest
from scrapy import Spider
from scrapy.exceptions import UsageError
from scrapy.utils.test import get_crawler

from scrapy_openclaw.commands.ctl import Command, format_domains, parse_duration
from scrapy_openclaw.control import ControlError, Controller, validate
from scrapy_openclaw.errors import Classification, ErrorClass
from scrapy_openclaw.health import HealthRegistry
from scrapy_openclaw.policy import PolicySet


class _Spider(Spider):
    name = "ctl"


def test_validate_normalises_and_refuses():
    assert validate({"command": "hold", "domain": "a.example", "for": 60}, now=1000.0) == {
        "command": "hold",
        "domain": "a.example",
        "until": 1060.0,
    }
    assert validate({"command": "limit", "domain": "a", "rate": None}) == {
        "command": "limit",
        "domain": "a",
        "rate": None,
    }
    assert validate({"command": "close"})["reason"] == "openclaw_ctl"
    for bad in (
        [],
        {"command": "rm -rf"},
        {"command": "hold", "domain": "a"},
        {"command": "hold", "domain": "a", "for": 1, "until": 5},
        {"command": "hold", "domain": "a b", "for": 1},
        {"command": "hold", "domain": "a", "for": math.inf},
        {"command": "hold", "domain": "a", "for": True},
        {"command": "limit", "domain": "a"},
        {"command": "limit", "domain": "a", "rate": -1},
        {"command": "limit", "domain": "a", "concurrency": 1.5},
        {"command": "close", "reason": "x\n"},
        {"command": "release"},
    ):
        with pytest.raises(ControlError):
            validate(bad)


def test_overrides_in_the_registry():
    reg = HealthRegistry(PolicySet({}, []), default_concurrency=8)
    now = 1000.0
    reg.record_success("a", 0.01, now=now)
    assert reg.blocked_until("a", now) <= now
    reg.control("a", now, ctl_hold=now + 60)
    assert reg.blocked_until("a", now) == now + 60
    assert reg.ready_at("a", now) == now + 60 and not reg.try_acquire("a", now)
    reg.control("a", now, ctl_hold=0)
    assert reg.blocked_until("a", now) <= now
    # a server's Retry-After hold is not the operator's to release
    reg.hold("a", now + 5)
    reg.control("a", now, ctl_hold=0)
    assert reg.blocked_until("a", now) == now + 5
    reg.control("a", now, ctl_rate=2.0, ctl_concurrency=3)
    assert reg.state("a", now + 10).rate == 2.0
    assert reg.concurrency("a", 8) == 3 and reg.concurrency("a", 1) == 3  # replaces the cap
    reg.control("a", now, ctl_rate=0, ctl_concurrency=0)
    assert reg.concurrency("a", 8) == 8
    assert reg.overrides("a") == {"hold_until": None, "rate": None, "concurrency": None, "given_up": False}
    reg.control("a", now, ctl_down=1)
    assert reg.given_up("a", now) and reg.overrides("a")["given_up"]
    reg.control("a", now, ctl_down=0)
    assert not reg.given_up("a", now)
    with pytest.raises(ValueError):
        reg.control("a", now, health=5)


def test_restore_ends_an_automatic_give_up_and_restarts_its_clock():
    policies = PolicySet.for_crawler(
        get_crawler(
            _Spider,
            {
                "OPENCLAW_POLICY": {
                    "defaults": {
                        "health": {
                            "give_up_after": 10.0,
                            "circuit_failures": 1,
                            "circuit_cooldown": 50.0,
                            "circuit_jitter": 0.0,
                        }
                    }
                }
            },
        )
    )
    reg = HealthRegistry(policies)
    reg.record_failure("a", Classification(ErrorClass.NETWORK, "connection_refused"), now=1000.0)
    assert reg.given_up("a", 1011.0)
    reg.control("a", 1011.0, ctl_down=0)
    assert not reg.given_up("a", 1012.0) and reg.given_up("a", 1022.0)


def test_overrides_survive_a_snapshot():
    reg = HealthRegistry(PolicySet({}, []))
    reg.control("a", ctl_hold=2e9, ctl_rate=1.5, ctl_concurrency=2, ctl_down=1)
    again = HealthRegistry(PolicySet({}, []))
    again.restore(reg.snapshot())
    assert again.overrides("a") == {"hold_until": 2e9, "rate": 1.5, "concurrency": 2, "given_up": True}
    assert again.blocked_until("a") == 2e9 and again.given_up("a")


def test_controller_logs_counts_and_lists(caplog):
    crawler = get_crawler(_Spider, {})
    controller = Controller.for_crawler(crawler)
    controller.pending = lambda: {"b": 4}
    with caplog.at_level(logging.INFO, logger="scrapy_openclaw.control.controller"):
        out = controller.execute({"command": "hold", "domain": "a", "for": 30}, who="alice@127.0.0.1")
    assert out["ok"] and out["domain_state"]["held_until"] > 0 and out["domain_state"]["overrides"]["hold_until"]
    assert "Control command hold" in caplog.text and "alice@127.0.0.1" in caplog.text
    assert crawler.stats.get_value("openclaw/control/hold") == 1
    listed = controller.execute({"command": "domains"}, who="bob")
    assert [(r["domain"], r["pending"]) for r in listed["domains"]] == [("a", 0), ("b", 4)]
    with pytest.raises(ControlError):
        controller.execute({"command": "pause"}, who="bob")  # no engine: the crawl is not running


def _opts(**kw):
    base = {"for_": None, "until": None, "rate": None, "concurrency": None, "reason": None}
    base.update(kw)
    return argparse.Namespace(**base)


def test_cli_builds_commands():
    assert Command.build(["hold", "a"], _opts(for_="15m"))["for"] == 900
    assert Command.build(["limit", "a"], _opts(rate="2.5", concurrency="off")) == {
        "command": "limit",
        "domain": "a",
        "rate": 2.5,
        "concurrency": None,
    }
    assert Command.build(["give-up", "a"], _opts()) == {"command": "give_up", "domain": "a"}
    assert Command.build(["close"], _opts(reason="maintenance")) == {"command": "close", "reason": "maintenance"}
    assert parse_duration("90") == 90 and parse_duration("2h") == 7200
    for args in ([], ["hold"], ["pause", "x"]):
        with pytest.raises(UsageError):
            Command.build(args, _opts())
    with pytest.raises(UsageError):
        parse_duration("soon")


def test_cli_table():
    text = format_domains(
        {
            "paused": True,
            "domains": [
                {
                    "domain": "shop.example",
                    "health": 91.5,
                    "rate": 2.0,
                    "concurrency": 2,
                    "circuit": "closed",
                    "held_until": 1.8e9,
                    "given_up": False,
                    "pending": 12,
                    "overrides": {"hold_until": 1.8e9, "rate": 2.0, "concurrency": None, "given_up": False},
                },
                {
                    "domain": "evil\x1b[2J",
                    "health": 0,
                    "rate": None,
                    "concurrency": 1,
                    "circuit": "open",
                    "held_until": None,
                    "given_up": True,
                    "pending": 0,
                    "overrides": {"given_up": True},
                },
            ],
        }
    )
    assert "hold, rate<=2" in text and "GIVEN UP (operator)" in text and "crawl: PAUSED" in text
    assert "\x1b" not in text
