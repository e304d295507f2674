"""One error family: every exception chute raises on purpose is a ChuteError and a built-in."""

import chute
import chute.errors as errors
import chute.insitu
import chute.metrics


def test_every_error_is_a_chute_error_and_keeps_a_builtin_base() -> None:
    classes = [getattr(errors, name) for name in errors.__all__]
    assert all(issubclass(c, errors.ChuteError) for c in classes)
    builtin = (RuntimeError, ValueError, OSError, LookupError, TypeError)
    for c in classes:
        if c not in (errors.ChuteError, errors.StoreError):
            assert issubclass(c, builtin) or issubclass(c, errors.StoreError), c


def test_the_error_classes_are_the_ones_each_part_exports() -> None:
    assert chute.metrics.RunLockedError is errors.RunLockedError
    assert chute.metrics.WriterClosedError is errors.WriterClosedError
    assert chute.insitu.BadChunkError is errors.BadChunkError
    assert issubclass(errors.RunLockedError, RuntimeError)
    assert issubclass(errors.BadChunkError, RuntimeError)
    assert chute.ChuteError is errors.ChuteError
