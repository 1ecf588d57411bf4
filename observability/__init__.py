"""Observability: Prometheus metrics (GET /metrics) and the usage stats kept per key, model
and hour (GET /admin/stats).

metrics.py     the metric objects and the exposition (multiprocess-aware)
collectors.py  the gauges, read from the runtime at scrape time
recording.py   what the access log calls once per request: counters, histograms, usage
usage.py       the usage buffer: counts batched in memory, flushed to the database
models.py      UsageBucket (per key, model and hour; rolled up into days)
views.py       GET /metrics and GET /admin/stats
"""
