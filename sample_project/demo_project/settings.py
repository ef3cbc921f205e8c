"""A plain Scrapy project with scrapy-openclaw switched on by one line."""

BOT_NAME = "demo_project"
SPIDER_MODULES = ["demo_project.spiders"]
NEWSPIDER_MODULE = "demo_project.spiders"

# The one line that enables scrapy-openclaw (health, retry, deadline queue,
# dead letters, metrics; checkpointing once OPENCLAW_CHECKPOINT_DIR is set).
ADDONS = {"scrapy_openclaw.Addon": 100}

# Per-domain policies: demo_project/openclaw.yaml, read as package data so that
# it travels with the project (a scrapyd egg: see setup.py). A relative path,
# e.g. "openclaw.yaml", would be read from the project root (beside scrapy.cfg).
OPENCLAW_POLICY_FILE = "pkg://demo_project/openclaw.yaml"
# Relative to the project root (beside scrapy.cfg), whatever the working directory.
OPENCLAW_DLQ_URI = "output/deadletters.jsonl"

FEEDS = {"output/items.jsonl": {"format": "jsonlines", "overwrite": True}}

ROBOTSTXT_OBEY = False  # the embedded demo site has no robots.txt
CONCURRENT_REQUESTS = 16
DOWNLOAD_TIMEOUT = 5  # the demo site has hanging hosts; don't wait 3 minutes
LOG_LEVEL = "INFO"
