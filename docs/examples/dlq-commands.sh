scrapy openclaw-dlq list products --domain shop.example.com --class protocol_retryable --since 2h --limit 20
scrapy openclaw-dlq show 60f45dde7e18          # an id prefix is enough; --raw: as stored
scrapy openclaw-dlq stats products             # counts by domain and class
scrapy openclaw-dlq replay products --dry-run  # what the replay would send
scrapy openclaw-dlq replay products            # protocol_permanent and domain_down only with --class or --all
scrapy openclaw-dlq replay products --class domain_down --include-replayed
scrapy openclaw-dlq purge products --class protocol_permanent --yes
