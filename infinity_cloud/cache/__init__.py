"""Results cached across requests, and across replicas: a model's answer rows, keyed by what
the model is and exactly what it reads, so a re-index that embeds the same chunks again, or
the same query asked all day, runs the model once (`result_cache.ResultCache`).

In process, a byte-bounded LRU (`memory_store`); shared, Redis (`redis_store`, `--cache-url`),
which every container of a deployment reads and writes.
"""
