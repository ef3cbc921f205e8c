ADDONS = {"scrapy_openclaw.Addon": 100}
