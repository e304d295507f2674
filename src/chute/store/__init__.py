"""The record store: byte records in the Zrecord format, gathered by the compiled core."""

from chute.store._format import Codec
from chute.store._remote import RemoteStore
from chute.store._store import RecordStore

__all__ = ["Codec", "RecordStore", "RemoteStore"]
