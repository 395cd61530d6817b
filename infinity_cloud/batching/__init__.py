"""Dynamic batching: a bounded per-model queue cut by a padded-token budget, and the
threads that run and finish batches. Knows costs and futures, nothing of models or HTTP."""

from infinity_cloud.batching.queue import BatchQueue, WorkItem
from infinity_cloud.batching.worker import ORIGIN, BatchReport, BatchWorker

__all__ = ["ORIGIN", "BatchQueue", "BatchReport", "BatchWorker", "WorkItem"]
