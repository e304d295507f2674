"""Which stage limits an in-place loader's throughput, from the waits it measured."""

from __future__ import annotations

from ._scheduler import StageTimes


def limiting_stage(
    consumer_wait: float, wall: float, t: StageTimes, fetch_seconds: float
) -> tuple[str, str]:
    """The stage that limits throughput, read from measured waits along the chain.

    The consumer waiting for batches means the batch pass feeding it is the limit.
    The pass itself waits for room in the pool, for the slabs of its next batch, or
    is busy assembling; slabs in turn spend their time being fetched or decoded
    (including waiting for a decode thread). The largest share at each step decides.
    """
    if wall <= 0:
        return "unknown", "no pass has run yet; iterate a view, then describe() again"
    waiting = consumer_wait / wall
    head = f"the consumer waited {waiting:.0%} of the time"
    if waiting < 0.1:
        return "consumer", f"{head}: the loader keeps up, the training step is the limit"
    feed = {"pool": t.admit_wait, "slabs": t.slab_wait, "transform+assemble": t.gather}
    spent = sum(feed.values()) or 1.0
    shares = ", ".join(f"{k} {v / spent:.0%}" for k, v in feed.items())
    why = f"{head}; the batch pass spent its time on: {shares}"
    top = max(feed, key=lambda k: feed[k])
    if top != "slabs":
        return top, why
    slab = {"fetch": fetch_seconds, "decode": t.decode + t.queue + t.transform}
    detail = (
        f"; slab time: fetch {slab['fetch']:.2f} s, decode {t.decode:.2f} s, waiting "
        f"for a decode thread {t.queue:.2f} s, chunk transforms {t.transform:.2f} s"
    )
    return max(slab, key=lambda k: slab[k]), why + detail
