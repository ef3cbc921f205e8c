OPENCLAW_CHECKPOINT_DIR = "crawls/products"  # crash-safe resume: run the same command again
