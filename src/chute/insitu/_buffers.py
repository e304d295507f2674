"""Batch output arrays: the ring both loaders share lives in `chute._buffers`."""

from chute._buffers import BatchBuffers

__all__ = ["BatchBuffers"]
