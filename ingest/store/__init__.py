"""Ingest's store: one validated batch written atomically in about five round trips.

`batch` owns the transaction and the order of the round trips; `receipts` the (agent, seq)
receipt and the agent's counters; `writer` folds the records into COPY rows and live state
(`batch_state` the groups and ranks a batch names, `fences` fencing and ownership per
record, `handlers` one module of write handlers per record family, each kind registered
as a `kinds.Kind`); `tables` the COPY column lists; `live_state` the live-state SQL and
this process's memory of the activity it wrote; `fleet_card` the node card read back for
the live push; `errors` the 400s that name a record; `group_commit` lets the batches that
arrive at once share one transaction. Callers import from here.
"""

from ingest.store.batch import IngestResult, ingest_batch
from ingest.store.errors import FutureRecordError, RecordError
from ingest.store.group_commit import store
from ingest.store.live_state import forget_recent
from ingest.store.receipts import AgentNotOwnedError

__all__ = [
    "AgentNotOwnedError",
    "FutureRecordError",
    "IngestResult",
    "RecordError",
    "forget_recent",
    "ingest_batch",
    "store",
]
