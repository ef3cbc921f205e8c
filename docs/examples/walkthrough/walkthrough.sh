#!/usr/bin/env bash
# The walkthrough of docs/walkthrough.md, step by step; tests/test_walkthrough.py runs it as it is.
# Run it in an empty folder: bash walkthrough.sh (PRACTICE_PORT and METRICS_PORT change the ports).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# [practice-site]
python -m scrapy_openclaw.testing.chaos --port "${PRACTICE_PORT:-8641}" > practice.txt &
PRACTICE_PID=$!
until grep -q "^START_URLS=" practice.txt; do sleep 0.2; done
cat practice.txt
START_URLS="$(sed -n 's/^START_URLS=//p' practice.txt)"
# [/practice-site]
trap 'kill "$PRACTICE_PID" 2> /dev/null || true' EXIT  # (stop the site also if a step fails)

# [project]
scrapy startproject shop
cd shop
# [/project]

# [addon]
# Replace the template's "ADDONS = {}" line (adding ours above it would leave the add-on off).
sed -i 's/^ADDONS = {}$/ADDONS = {"scrapy_openclaw.Addon": 100}/' shop/settings.py
grep -n '^ADDONS' shop/settings.py
# [/addon]

# [spider]
cp "$HERE/pages.py" shop/spiders/pages.py
# [/spider]

# [crawl]
scrapy crawl pages -a start_urls="$START_URLS" -o items.jsonl \
    -s OPENCLAW_METRICS_PORT="${METRICS_PORT:-9410}" 2> crawl.log &
CRAWL_PID=$!
# [/crawl]

# [metrics]
until curl -sf "http://127.0.0.1:${METRICS_PORT:-9410}/metrics" > metrics.txt; do
    kill -0 "$CRAWL_PID"  # (still crawling)
    sleep 0.2
done
grep -E '^scrapy_openclaw_downloader_(requests|failures)_total' metrics.txt
# [/metrics]

# [table]
wait "$CRAWL_PID"
grep -A4 "OpenClaw domains (top 3 of 3, whole crawl)" crawl.log
grep "dead letter(s) written" crawl.log
# [/table]

# [dead-letters]
scrapy openclaw-dlq list pages
scrapy openclaw-dlq replay pages -o recovered.jsonl
cat recovered.jsonl
# [/dead-letters]

# [stop]
kill "$PRACTICE_PID"
# [/stop]
