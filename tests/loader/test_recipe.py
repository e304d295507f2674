"""What ``map=`` and ``transform=`` see and give: a record's draws keyed by its position in
the global batch (the same sharded or not, on any number of hosts), the states saved when
sharded draws were keyed otherwise refused, map outputs collated whatever their key order,
and the batch made of what ``map`` returns."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import chute
from chute import DataLoader
from chute.errors import StateMismatchError
from tests.loader import maps

X = np.arange(96, dtype=np.int64)


def _draws(count: int, **options: Any) -> dict[int, float]:
    """Record -> its draw over the first steps of every shard of ``count`` together."""
    seen: dict[int, float] = {}
    for index in range(count):
        with DataLoader({"x": X}, batch_size=8, seed=3, map=maps.draw, shard=(index, count),
                        num_threads=1, **options) as dl:  # fmt: skip
            for _ in range(5):
                batch = next(dl)
                seen.update(zip(batch["x"].tolist(), batch["r"].tolist(), strict=True))
    return seen


def test_a_records_draws_do_not_depend_on_the_sharding() -> None:
    whole = _draws(1)
    assert len(whole) == 40
    assert _draws(2) == whole and _draws(4) == whole and _draws(8) == whole


def test_a_records_draws_do_not_depend_on_the_sharding_in_worker_processes() -> None:
    assert _draws(2, workers=1) == _draws(1)


def test_an_evaluation_passs_draws_do_not_depend_on_the_sharding() -> None:
    def draws(count: int) -> dict[int, float]:
        seen: dict[int, float] = {}
        for index in range(count):
            with chute.iterate({"x": X[:30]}, 8, map=maps.draw, shard=(index, count)) as p:
                for b in p:  # a shard's last slice may hold no records, so nothing mapped
                    if b.get("x") is not None and len(b["x"]):
                        seen.update(zip(b["x"].tolist(), b["r"].tolist(), strict=True))
        return seen

    assert len(draws(1)) == 30 and draws(2) == draws(1) and draws(4) == draws(1)


def test_the_transforms_generator_is_the_same_on_every_host() -> None:
    def first(shard: tuple[int, int]) -> float:
        with DataLoader({"x": X}, batch_size=8, seed=3, transform=maps.batch_draw,
                        shard=shard) as dl:  # fmt: skip
            return float(next(dl)["t"])

    assert first((0, 1)) == first((0, 2)) == first((1, 2)) == first((3, 4))


def _old(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` as chute wrote it before version 3."""
    return {k: v for k, v in state.items() if k not in ("kind", "fingerprint")} | {"version": 2}


def test_a_sharded_state_from_before_global_draws_is_refused_when_map_draws() -> None:
    with DataLoader({"x": X}, batch_size=8, seed=3, map=maps.draw, shard=(1, 2)) as dl:
        state = dl.state_dict()
        assert state["version"] == 3
        with pytest.raises(StateMismatchError, match=r"version: saved 2.*seek\(step\)"):
            dl.load_state_dict(_old({**state, "step": 7}))
        assert dl.step == 0
        dl.load_state_dict({**state, "step": 7})
        assert dl.step == 7
    for options in ({"map": maps.draw}, {"map": maps.identity, "shard": (1, 2)}):
        with DataLoader({"x": X}, batch_size=8, seed=3, **options) as dl:
            dl.load_state_dict(_old({**dl.state_dict(), "step": 7}))
            assert dl.step == 7


@pytest.mark.parametrize("workers", [0, 1])
def test_map_outputs_with_the_same_keys_in_another_order_collate(workers: int) -> None:
    with DataLoader({"x": X}, batch_size=8, sampler="sequential", map=maps.keys_by_parity,
                    workers=workers) as dl:  # fmt: skip
        batch = next(dl)
    assert list(batch) == ["b", "a"]  # record 0's order
    assert batch["a"].tolist() == list(range(8)) and batch["b"].tolist() == [-k for k in range(8)]


def test_map_outputs_with_other_keys_are_refused() -> None:
    with DataLoader({"x": X}, batch_size=8, map=maps.draw) as dl:
        next(dl)
    odd = DataLoader({"x": X}, batch_size=8, sampler="sequential",
                     map=lambda r: {"a": 1} if int(r["x"]) % 2 else {"a": 1, "b": 2})  # fmt: skip
    with odd, pytest.raises(TypeError, match=r"\['a'\] for record 1.*same keys"):
        next(odd)


@pytest.mark.parametrize("workers", [0, 1])
def test_the_batch_is_what_map_returns(tmp_path: Any, workers: int) -> None:
    """The gathered streams are replaced by the mapped records (the bytes are not kept, nor
    sent back from a worker): the docs' augment example."""
    blobs = [bytes([k] * (k + 1)) for k in range(16)]
    chute.write_ragged(tmp_path / "blobs", blobs).close()
    labels = np.arange(16, dtype=np.int64)
    streams = {"blob": chute.BytesDataset(tmp_path / "blobs"), "label": labels}
    with DataLoader(streams, batch_size=4, sampler="sequential", map=maps.decode,
                    workers=workers) as dl:  # fmt: skip
        batch = next(dl)
        state = dl.state_dict()
        after = next(dl)
    assert list(batch) == ["image", "label"]
    assert [a.tolist() for a in batch["image"]] == [[k + 1] * (k + 1) for k in range(4)]
    with DataLoader(streams, batch_size=4, sampler="sequential", map=maps.decode) as dl:
        dl.load_state_dict(state)
        again = next(dl)
    assert list(again) == ["image", "label"] and again["label"].tolist() == after["label"].tolist()


def test_a_padded_pass_keeps_its_mask_beside_what_map_returns() -> None:
    with chute.iterate({"x": X[:10]}, 8, last="pad", map=maps.keys_by_parity) as p:
        batches = list(p)
    assert [list(b) for b in batches] == [["b", "a", "mask"]] * 2
    assert batches[1]["mask"].tolist() == [True, True] + [False] * 6
