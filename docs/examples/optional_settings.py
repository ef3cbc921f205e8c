OPENCLAW_POLICY_FILE = "openclaw.yaml"  # optional: per-domain policies, next to scrapy.cfg
OPENCLAW_CHECKPOINT_DIR = "crawls/products"  # optional: crash-safe resume
OPENCLAW_METRICS_PORT = 9410  # optional: Prometheus /metrics on 127.0.0.1:9410
