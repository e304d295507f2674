"""Builds chute's compiled core against the system libzstd (no headers needed)."""

from setuptools import Extension, setup

_CFLAGS = ["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-pthread"]

setup(
    ext_modules=[
        Extension(
            "chute._native._zrecord",
            sources=[
                "src/chute/_native/zrecord_module.c",
                "src/chute/_native/gather.c",
                "src/chute/_native/pyface.c",
                "src/chute/_native/tokens.c",
                "src/chute/_native/tokens_module.c",
                "src/chute/_native/compress.c",
                "src/chute/_native/zctx.c",
                "src/chute/_native/pool.c",
                "src/chute/_native/crc32c.c",
            ],
            extra_compile_args=_CFLAGS,
            # libzstd.so.1 ships on every machine; its unversioned dev symlink does not.
            extra_link_args=["-pthread", "-l:libzstd.so.1"],
        ),
        Extension(
            "chute._native._sampler",
            sources=["src/chute/_native/sampler_module.c"],
            extra_compile_args=_CFLAGS,
        ),
        Extension(
            "chute._native._curves",
            sources=["src/chute/_native/curves_module.c"],
            extra_compile_args=_CFLAGS,
        ),
    ],
)
