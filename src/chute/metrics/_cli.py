"""`chute metrics ...`: convert jsonl logs; list, verify, tail and plot runs; serve a dashboard."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from chute._util.cores import usable_cores
from chute.errors import CorruptRunError, QueryError

from . import _format as F
from ._jsonl import DEFAULT_SKIP, ConvertOptions, convert_run, find_runs
from ._query import Query, flatten_config, last_values, parse, run_row
from ._reader import Reader
from ._source import is_run


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="chute metrics", description="Plättli metric logs.")
    sub = p.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser("from-jsonl", help="convert <run>/metrics.jsonl logs into Plättli runs")
    c.add_argument("indirs", nargs="*", default=["."], help="folders whose run folders to convert")
    c.add_argument("-o", "--outdir", help="write <outdir>/<run>.plattli instead of in place")
    c.add_argument("-w", "--workers", type=int, default=max(1, usable_cores() - 2))
    c.add_argument(
        "--skipcols",
        action="append",
        default=[],
        metavar="REGEXP",
        help='skip metrics fully matching REGEXP ("DEFAULT": [pg]norm.*)',
    )
    c.add_argument("--deep", action="store_true", help="search run folders recursively")
    c.add_argument(
        "--allow-rewinds",
        action="store_true",
        help="a step going back truncates the data logged from it on",
    )

    tb = sub.add_parser(
        "from-tensorboard", help="convert TensorBoard event files into a run (chute[tensorboard])"
    )
    tb.add_argument("events", metavar="EVENTS_DIR", help="a folder of *.tfevents.* files")
    tb.add_argument("run", metavar="RUN", help="the run to write")
    tb.add_argument("--overwrite", action="store_true", help="replace an existing run")

    ls = sub.add_parser("ls", help="metrics of a run, or the runs in a folder")
    ls.add_argument("run", help="a run, or a folder holding runs")
    ls.add_argument(
        "--where",
        type=_where_arg,
        metavar="QUERY",
        help="with a folder: list only the runs matching QUERY, on their config (nested keys "
        "dotted, also as config.KEY) and their metrics' last values, e.g. \"lr < 1e-3 and "
        "model.depth in [12, 24] and not name ~ '^smoke'\"",
    )

    v = sub.add_parser("verify", help="check a run: archive CRC-32s, hot-log lines, columns")
    v.add_argument("run")

    t = sub.add_parser("tail", help="print the latest steps of a run")
    t.add_argument("run", help="a run, or a folder holding runs")
    t.add_argument("-n", "--lines", type=int, default=10, help="steps to print first")
    t.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new steps until the run finishes"
    )
    t.add_argument("--interval", type=float, default=1.0, help="seconds between polls")
    t.add_argument(
        "--idle-exit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="with -f: stop after this long without new steps",
    )

    pl = sub.add_parser(
        "plot",
        help="plot metrics of runs, overlaid, to an image (needs matplotlib)",
        description="RUN METRIC... plots one run. To compare runs, name the metrics with "
        "-m (then every positional is a run) or the runs with -r (then every positional "
        "is a metric).",
    )
    pl.add_argument("names", nargs="*", metavar="RUN|METRIC")
    pl.add_argument("-m", "--metric", action="append", default=[], help="a metric (repeatable)")
    pl.add_argument("-r", "--run", action="append", default=[], help="a run (repeatable)")
    pl.add_argument("-o", "--output", required=True, help="the image file to write, e.g. out.png")
    pl.add_argument("--x", default="step", help='x axis: "step" or a metric such as walltime')
    pl.add_argument("--logy", action="store_true", help="logarithmic y axis")
    pl.add_argument(
        "--smooth", type=float, default=0.0, metavar="FACTOR",
        help="EMA factor in [0, 1) drawn over faint raw curves (default 0: no smoothing)",
    )  # fmt: skip

    sv = sub.add_parser("serve", help="live dashboard of runs in the browser (chute[dashboard])")
    sv.add_argument("paths", nargs="+", metavar="PATH", help="runs, or folders searched for runs")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    sv.add_argument("--port", type=int, default=0, help="port (default 0: any free port)")
    sv.add_argument("--open", action="store_true", help="open the page in a web browser")
    return p


def main(argv: list[str]) -> int:
    """Entry point for `chute metrics` (argv without the leading "metrics")."""
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "from-jsonl":
            return _from_jsonl(args)
        if args.cmd == "from-tensorboard":
            return _from_tensorboard(args)
        if args.cmd == "ls":
            if not _claims_run(args.run):
                return _ls_runs(args.run, args.where)
            if args.where is not None:
                print(f"chute metrics ls: --where filters the runs of a folder; {args.run!r} "
                      "is one run", file=sys.stderr)  # fmt: skip
                return 2
            return _ls(args.run)
        if args.cmd == "verify":
            return _verify(args.run)
        if args.cmd == "tail":
            return _tail(args)
        if args.cmd == "serve":
            return _serve(args)
        return _plot(args)
    except (OSError, ValueError, KeyError, ImportError) as e:
        print(f"chute metrics {args.cmd}: {e}", file=sys.stderr)
        return 1


def _where_arg(text: str) -> Query:
    """`--where`'s argument parsed; a bad query is a usage error (exit status 2)."""
    try:
        return parse(text)
    except QueryError as e:
        raise argparse.ArgumentTypeError(f"bad query: {e}") from None


def _plot(args: argparse.Namespace) -> int:
    from ._plot import plot_runs, run_labels

    if args.run and args.metric:
        runs, metrics = args.run, args.metric
        if args.names:
            raise ValueError("with both -r and -m, give no positional names")
    elif args.run:
        runs, metrics = args.run, args.names
    elif args.metric:
        runs, metrics = args.names, args.metric
    else:
        runs, metrics = args.names[:1], args.names[1:]
    if not runs or not metrics:
        raise ValueError("name a run and its metrics (RUN METRIC...), or use -m/-r to compare runs")
    found = [run for given in runs for run in _runs_of(given)]
    labels = run_labels([label for _, label in found])
    runs = [run for run, _ in found]
    missing = plot_runs(runs, metrics, args.output, x=args.x, smooth=args.smooth,
                        logy=args.logy, labels=labels)  # fmt: skip
    for run, name in missing:
        print(f"note: run {run} has no metric {name!r}", file=sys.stderr)
    print(f"wrote {args.output}")
    return 0


def _from_tensorboard(args: argparse.Namespace) -> int:
    from ._tensorboard import from_tensorboard

    done = from_tensorboard(args.events, args.run, overwrite=args.overwrite)
    left = f"; {done['skipped']} values of other kinds left out" if done["skipped"] else ""
    print(f"wrote {args.run}: {done['metrics']} metrics, {done['steps']} steps, "
          f"{done['values']} values{left}")  # fmt: skip
    return 0


def _serve(args: argparse.Namespace) -> int:
    try:
        from .dashboard import serve
    except ImportError as e:
        raise ImportError(f"the dashboard needs: pip install 'chute[dashboard]' ({e})") from e
    serve(args.paths, host=args.host, port=args.port, open_browser=args.open)
    return 0


def _from_jsonl(args: argparse.Namespace) -> int:
    skip = tuple(DEFAULT_SKIP if s == "DEFAULT" else s for s in args.skipcols)
    opts = ConvertOptions(skip=skip, allow_rewinds=args.allow_rewinds)
    jobs = []
    for run, rel in find_runs(args.indirs, args.deep):
        out = (
            os.path.join(args.outdir, rel + ".plattli")
            if args.outdir
            else os.path.join(run, "metrics.plattli")
        )
        jobs.append((run, out))
    if not jobs:
        print("no runs found (folders holding metrics.jsonl)", file=sys.stderr)
        return 1
    failed = 0
    if args.workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=min(args.workers, len(jobs))) as pool:
            futures = [pool.submit(convert_run, run, out, opts) for run, out in jobs]
            results = [
                (job, f.exception() or f.result()) for job, f in zip(jobs, futures, strict=True)
            ]
    else:
        results = []
        for run, out in jobs:
            try:
                results.append(((run, out), convert_run(run, out, opts)))
            except (OSError, ValueError) as e:
                results.append(((run, out), e))
    for (run, out), res in results:
        if isinstance(res, BaseException):
            failed += 1
            print(f"failed {run}: {res}", file=sys.stderr)
        else:
            print(f"converted {out} ({res[0]} rows, {res[1]} metrics)")
    return 1 if failed else 0


def _fmt(value: Any) -> str:
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.6g}"
    if isinstance(value, np.generic):
        return str(value.item())
    if isinstance(value, str):
        return value
    return json.dumps(value)


def _ls(run: str) -> int:
    with Reader(run) as r:
        manifest = r.manifest()
        rows = [("metric", "rows", "dtype", "last step", "last value")]
        for name in r.metrics():
            n = r.rows(name)
            dtype = manifest.get(name, {}).get("dtype", "hot")
            last = r.metric(name, idx=-1, dtype="storage") if n else ("-", "-")
            rows.append((name, str(n), dtype, str(last[0]), _fmt(last[1])[:60]))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _runs_of(given: str) -> list[tuple[str, str]]:
    """The runs a path names, each with the name to show for it: the run itself, or the
    runs found under a folder (named relative to it), as `ls` and `serve` take them."""
    if _claims_run(given):
        return [(given, given)]
    if not os.path.isdir(given):
        raise FileNotFoundError(f"{given!r} is neither a run nor a folder of runs")
    runs = _find_runs(given)
    if not runs:
        raise FileNotFoundError(f"no runs under {given!r}")
    return [(run, os.path.relpath(run, given)) for run in runs]


def _claims_run(path: str) -> bool:
    """Whether `path` is a run or says it is one: a `*.plattli` file, or a folder holding a
    `metrics.plattli` (a damaged archive is then reported by opening it, not skipped)."""
    if os.path.isfile(path):
        return path.endswith(".plattli") or is_run(path)
    return is_run(path) or os.path.isfile(os.path.join(path, F.ZIP_NAME))


def _find_runs(root: str) -> list[str]:
    """Runs under `root`: folders that are runs (not searched further) and `*.plattli` files,
    damaged ones included."""
    found = []
    for d, dirs, files in os.walk(root):
        if d != root and _claims_run(d):
            found.append(d)
            dirs.clear()
            continue
        dirs.sort()
        found += [os.path.join(d, f) for f in sorted(files) if f.endswith(".plattli")]
    return sorted(found)


def _ls_runs(root: str, where: Query | None = None) -> int:
    if not os.path.isdir(root):
        raise FileNotFoundError(f"{root!r} is neither a run nor a folder of runs")
    runs = _find_runs(root)
    if not runs:
        raise FileNotFoundError(f"no runs under {root!r}")
    rows = [("run", "state", "metrics", "rows", "exported")]
    damaged = 0
    for run in runs:
        try:
            row = _run_row(run, root, where)
        except (CorruptRunError, OSError) as e:
            print(f"chute metrics ls: {e}", file=sys.stderr)
            damaged += 1
            row = (os.path.relpath(run, root), "damaged", "-", "-", "-")
        if row is not None:
            rows.append(row)
    if where is not None and len(rows) == 1:
        print(f"no run under {root!r} matches {where.text!r}", file=sys.stderr)
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 1 if damaged else 0


def _run_row(run: str, root: str, where: Query | None) -> tuple[str, str, str, str, str] | None:
    """`ls DIR`'s line for one run (None: `where` does not match it)."""
    with Reader(run) as r:
        state = "finished" if r.finished else "live"
        if where is not None:
            config = flatten_config(r.config())
            fields = run_row(
                config,
                last_values(r, where.fields - config.keys()),
                run=os.path.relpath(run, root),
                status=state,
                metrics=len(r.metrics()),
            )
            if not where.matches(fields):
                return None
        return (
            os.path.relpath(run, root),
            state,
            str(len(r.metrics())),
            str(r.approx_max_rows()),
            r.when_exported() or "-",
        )


def _verify(run: str) -> int:
    with Reader(run) as r:
        problems = r.verify()
        count = len(r.metrics()) if not problems else 0
    for p in problems:
        print(p)
    if problems:
        print(f"{run}: damaged ({len(problems)} problem{'s' * (len(problems) > 1)})")
        return 1
    print(f"{run}: ok ({count} metrics checked)")
    return 0


def _steps_after(r: Reader, after: int) -> dict[int, dict[str, Any]]:
    """Values of every metric at steps > `after`, grouped by step."""
    out: dict[int, dict[str, Any]] = {}
    for name in r.metrics():
        steps, values = r.metric(name, start=after + 1, dtype="storage")
        for s, v in zip(steps.tolist(), values, strict=True):
            out.setdefault(int(s), {})[name] = v
    return dict(sorted(out.items()))


def _print_steps(rows: dict[int, dict[str, Any]], prefix: str = "") -> None:
    for step, vals in rows.items():
        body = " ".join(f"{k}={_fmt(v)}" for k, v in sorted(vals.items()))
        print(f"{prefix}{step}: {body}", flush=True)


def _tail(args: argparse.Namespace) -> int:
    """The latest steps of a run, or of every run under a folder (each line then starts
    with the run's name); with ``-f``, new steps as they come, until every run finishes."""
    found = _runs_of(args.run)
    prefix = {run: f"{label}: " if len(found) > 1 else "" for run, label in found}
    last: dict[str, int] = {}
    damaged = 0
    for run, _ in found:
        try:
            with Reader(run) as r:
                rows = _steps_after(r, -1)
        except CorruptRunError as e:  # named, and the other runs followed
            print(f"chute metrics tail: {e}", file=sys.stderr)
            damaged += 1
            continue
        _print_steps(dict(list(rows.items())[-args.lines :]) if args.lines > 0 else {},
                     prefix[run])  # fmt: skip
        last[run] = max(rows, default=-1)
    idle_since = time.monotonic()
    live = set(last)
    while args.follow and live:
        time.sleep(args.interval)
        for run in sorted(live):
            try:
                with Reader(run) as r:
                    new, finished = _steps_after(r, last[run]), r.finished
            except FileNotFoundError:  # caught between the folder and its archive: poll again
                continue
            if new:
                _print_steps(new, prefix[run])
                last[run] = max(new)
                idle_since = time.monotonic()
            if finished:
                live.discard(run)
        if args.idle_exit is not None and time.monotonic() - idle_since >= args.idle_exit:
            break
    return 1 if damaged else 0
