"""Leaf helpers that every part of chute may use, each written once.

The one internal package the parts share (besides each part's documented seams): nothing
here imports from a part of chute (only from `chute.errors` and the standard library and
numpy), so any layer can import it without a cycle.

- `closing`: the context-manager mixin (``with`` closes, ``__enter__`` returns the object).
- `waiting`: wait for every piece of work, then raise the first error.
- `progress`: the MiB progress bar of long writes.
- `buffers`: batch output arrays reused once nothing outside the ring holds them.
- `safe_open`: a file chute was pointed at is a regular file inside its folder, read with a bound.
- `shared_folder`: files the processes of a host publish for each other, within a byte budget.
- `process_slice`: which slice of each global batch (or which chunks) this process reads.
- `tree`: walking a batch (dicts, tuples, lists of arrays), each array leaf mapped.
- `fs`: atomic replacement of small files, fsync of folders, advisory locks.
- `cores`: how many cores this process may use.
- `orphans`: worker processes that end with their parent.
- `state`: the one state contract of everything resumable, and its one validator.
"""
