"""A stateful property test: any sequence of appends, deletes, compactions and reopenings
leaves the store equal to a plain Python list that had the same things done to it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from chute import RecordStore
from chute.store import _format


class StoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp())
        self.store = RecordStore(self.dir / "s.zr", mode="w")
        self.model: list[bytes] = []

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir)

    @rule(
        records=st.lists(
            st.binary(max_size=300)
            | st.builds(lambda n, b: bytes([b]) * n, st.integers(0, 2000), st.integers(0, 255)),
            max_size=8,
        ),
        codec=st.sampled_from(["raw", "zstd"]),
    )
    def append(self, records: list[bytes], codec: str) -> None:
        first = self.store.append(records, codec=codec)
        assert first == len(self.model)
        self.model.extend(records)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        picks = data.draw(st.lists(st.integers(0, len(self.model) - 1), min_size=1, max_size=5))
        self.store.delete(picks)
        for i in sorted(set(picks), reverse=True):
            self.model[i] = self.model[-1]
            self.model.pop()

    @rule()
    def compact(self) -> None:
        self.store.compact()
        stats = self.store.stats()
        assert stats["chunk_bytes"] == stats["live_bytes"]

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = RecordStore(self.dir / "s.zr", mode="a")

    @invariant()
    def matches_model(self) -> None:
        assert len(self.store) == len(self.model)
        values, offsets = self.store.gather_packed(np.arange(len(self.model)))
        got = [values[offsets[k] : offsets[k + 1]].tobytes() for k in range(len(self.model))]
        assert got == self.model
        with RecordStore(self.dir / "s.zr") as reader:  # what another process would see
            n = len(self.model)
            assert reader.verify() == {"records": n, "damaged": [], "unchecked": 0, "checked": n}


class SmallChunks(StoreModel):
    """The same, with chunks of a few KiB, so records roll over and compaction drops files."""

    def __init__(self) -> None:
        self._saved = _format.CHUNK_LIMIT
        _format.CHUNK_LIMIT = 4096
        super().__init__()

    def teardown(self) -> None:
        super().teardown()
        _format.CHUNK_LIMIT = self._saved


TestStoreModel = StoreModel.TestCase
TestStoreModel.settings = settings(max_examples=25, stateful_step_count=20, deadline=None)
TestSmallChunks = SmallChunks.TestCase
TestSmallChunks.settings = settings(max_examples=25, stateful_step_count=20, deadline=None)
