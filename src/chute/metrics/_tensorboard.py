"""`chute metrics from-tensorboard`: TensorBoard event files as a chute run.

The events are read with TensorBoard's own loader (``tensorboard`` package, the
``tensorboard`` extra), never parsed by hand. Scalars become numeric metrics, text becomes
text metrics, the hyperparameters of ``add_hparams`` become the run's config; the kinds a
metric run does not hold (images, histograms, graphs ...) are counted and left out.
"""

from __future__ import annotations

import os
from typing import Any

from ._direct import DirectWriter
from ._source import is_run
from ._streaming import CLOCK_WALL

__all__ = ["from_tensorboard"]

_TEXT_SUFFIX = "/text_summary"  # torch's SummaryWriter.add_text tags its summaries so


def _loaders() -> tuple[Any, Any, Any]:
    try:
        from tensorboard.backend.event_processing import event_file_loader
        from tensorboard.plugins.hparams import plugin_data_pb2
        from tensorboard.util import tensor_util
    except ImportError:
        raise ImportError(
            "reading TensorBoard event files needs the tensorboard package: "
            "pip install 'chute[tensorboard]'"
        ) from None
    return event_file_loader, plugin_data_pb2, tensor_util


def _event_files(root: str) -> list[str]:
    if not os.path.isdir(root):
        raise FileNotFoundError(f"{root!r} is not a folder of TensorBoard event files")
    found = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        found += [os.path.join(folder, f) for f in sorted(files) if ".tfevents." in f]
    if not found:
        raise FileNotFoundError(f"no TensorBoard event files (*.tfevents.*) under {root!r}")
    return found


def _name(sub: str, tag: str, hparams_runs: set[str]) -> str:
    """The metric a tag of the event files under ``sub`` becomes: the tag itself at the top
    and under an ``add_hparams`` run; ``main/key`` for the runs ``add_scalars`` makes
    (``main_key`` folders); ``sub/tag`` for any other folder."""
    if sub == "." or sub in hparams_runs:
        return tag
    prefix = tag.replace("/", "_") + "_"
    base = os.path.basename(sub)
    if base.startswith(prefix) and os.path.dirname(sub) == "":
        return f"{tag}/{base[len(prefix) :]}"
    return f"{sub}/{tag}"


def from_tensorboard(events_dir: str, run: str, *, overwrite: bool = False) -> dict[str, int]:
    """Convert the event files under ``events_dir`` into the chute run ``run`` (finished
    and zipped); returns counts: ``steps``, ``metrics``, ``values``, ``skipped`` (values
    of kinds a metric run does not hold). A value logged twice for a tag and step keeps the
    later one, as TensorBoard shows it. An existing run is refused unless ``overwrite``.

    Each step also gets ``clock/walltime``: the latest wall time of the events at that step.

    >>> import tempfile
    >>> from torch.utils.tensorboard import SummaryWriter as TorchWriter
    >>> from chute.metrics import Reader
    >>> events, run = tempfile.mkdtemp(), tempfile.mkdtemp() + "/run"
    >>> with TorchWriter(events) as w:
    ...     for step in range(3):
    ...         w.add_scalar("loss", 1.0 / (step + 1), step)
    >>> from_tensorboard(events, run)["steps"]
    3
    >>> with Reader(run) as r:
    ...     r.metric("loss")[1].round(3).tolist()
    [1.0, 0.5, 0.333]
    """
    loader, plugin_data, tensors = _loaders()
    rows: dict[int, dict[str, tuple[float, Any]]] = {}
    hparams: dict[str, Any] = {}
    hparams_runs: set[str] = set()
    skipped = 0
    events: list[tuple[str, Any]] = []
    for path in _event_files(events_dir):
        sub = os.path.relpath(os.path.dirname(path), events_dir)
        for event in loader.EventFileLoader(path).Load():
            events.append((sub, event))
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "hparams":
                    hparams_runs.add(sub)
    for sub, event in events:
        for value in event.summary.value:
            plugin = value.metadata.plugin_data.plugin_name
            if plugin == "hparams":
                data = plugin_data.HParamsPluginData.FromString(value.metadata.plugin_data.content)
                if data.WhichOneof("data") == "session_start_info":
                    for key, v in data.session_start_info.hparams.items():
                        kind = v.WhichOneof("kind")
                        hparams[key] = getattr(v, kind) if kind else None
                continue
            if plugin == "scalars" or value.WhichOneof("value") == "simple_value":
                if value.WhichOneof("value") == "simple_value":
                    item: Any = float(value.simple_value)
                else:
                    item = float(tensors.make_ndarray(value.tensor).reshape(-1)[0])
                tag = value.tag
            elif plugin == "text":
                cells = tensors.make_ndarray(value.tensor).reshape(-1)
                item = "\n".join(c.decode() if isinstance(c, bytes) else str(c) for c in cells)
                tag = value.tag.removesuffix(_TEXT_SUFFIX)
            else:
                skipped += 1
                continue
            step_rows = rows.setdefault(int(event.step), {})
            name = _name(sub, tag, hparams_runs)
            seen = step_rows.get(name)
            if seen is None or event.wall_time >= seen[0]:
                step_rows[name] = (event.wall_time, item)
    if not overwrite and is_run(run):
        raise FileExistsError(f"{run!r} is a run already; overwrite=True (--overwrite) replaces it")
    writer = DirectWriter(run, step=0, allow_resume_finalized=True)
    try:
        if hparams:
            writer.set_config(hparams)
        names: set[str] = set()
        for step in sorted(rows):
            if step > writer.step:
                writer.step = step
            values = {name: item for name, (_, item) in rows[step].items()}
            values.setdefault(CLOCK_WALL, max(wall for wall, _ in rows[step].values()))
            writer.write(values)
            writer.end_step()
            names.update(rows[step])
        writer.finish()
    except BaseException:
        writer.close()
        raise
    return {"steps": len(rows), "metrics": len(names),
            "values": sum(len(r) for r in rows.values()), "skipped": skipped}  # fmt: skip
