"""Batch output arrays: the ring both loaders share lives in `chute._util.buffers`."""

from chute._util.buffers import BatchBuffers

__all__ = ["BatchBuffers"]
