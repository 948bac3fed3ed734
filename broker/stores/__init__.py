"""Fragment stores: where rolled fragments are persisted (`file://`, `s3://`, `gs://`, `azure://`, `azure-ad://`).

`StoreRegistry` builds a store per URL; every store implements `FragmentStore`, and fails
with `StoreError` (or `StoreConfigError` for a bad URL). A store that can take a local file
without copying it (the file store, on the spool's filesystem) is also an `AdoptingStore`.
"""

from broker.stores.base import AdoptingStore, FragmentStore, LinkableFile, StoreConfigError, StoreError, StoreObject
from broker.stores.registry import StoreRegistry

__all__ = [
    "AdoptingStore", "FragmentStore", "LinkableFile", "StoreConfigError", "StoreError", "StoreObject", "StoreRegistry",
]
