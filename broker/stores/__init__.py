"""Fragment stores: where rolled fragments are persisted (`file://`, `s3://`).

`StoreRegistry` builds a store per URL; every store implements `FragmentStore`, and fails
with `StoreError` (or `StoreConfigError` for a bad URL).
"""

from broker.stores.base import FragmentStore, StoreConfigError, StoreError, StoreObject
from broker.stores.registry import StoreRegistry

__all__ = ["FragmentStore", "StoreConfigError", "StoreError", "StoreObject", "StoreRegistry"]
