"""Bulk embedding: a corpus into a Parquet dataset (`infinity-cloud embed`), resumable and exactly once."""
