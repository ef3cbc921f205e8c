"""Reusable test infrastructure: a chaos HTTP site, server processes, crawl runners."""
