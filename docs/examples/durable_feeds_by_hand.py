EXTENSIONS = {
    "scrapy.extensions.feedexport.FeedExporter": None,
    "scrapy_openclaw.checkpoint.feeds.DurableFeedExporter": 0,
}
