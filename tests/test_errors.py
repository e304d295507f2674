"""One error family: every exception chute raises on purpose is a ChuteError and a built-in."""

import chute
import chute.errors as errors
import chute.insitu
import chute.metrics

BUILTIN = (RuntimeError, ValueError, OSError, LookupError, TypeError)


def test_every_error_is_a_chute_error_and_keeps_a_builtin_base() -> None:
    classes = [getattr(errors, name) for name in errors.__all__]
    assert all(issubclass(c, errors.ChuteError) for c in classes)
    for c in classes:
        if c is not errors.ChuteError:
            assert issubclass(c, BUILTIN), c  # each one itself, not through a bare parent


def test_every_error_class_chute_defines_is_listed() -> None:
    defined = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, BaseException)
    }
    assert defined == set(errors.__all__)


def test_store_errors_are_runtime_errors_as_loaderx_ones_and_keep_narrower_bases() -> None:
    stores = [c for c in map(vars(errors).get, errors.__all__) if issubclass(c, errors.StoreError)]
    assert {errors.CorruptStoreError, errors.StoreLockedError, errors.StoreError} <= set(stores)
    assert all(issubclass(c, RuntimeError) for c in stores)  # loaderx: ZrecordError
    assert issubclass(errors.StoreNotFoundError, FileNotFoundError)
    for c in (errors.StoreClosedError, errors.StoreKindError, errors.SchemaMismatchError):
        assert issubclass(c, ValueError)


def test_a_bad_out_buffer_is_a_value_and_a_type_error_not_the_builtin_buffer_error() -> None:
    c = errors.OutBufferError
    assert issubclass(c, ValueError) and issubclass(c, TypeError)
    assert not issubclass(c, BufferError) and c.__name__ != "BufferError"
    assert chute.OutBufferError is c


def test_the_error_classes_are_the_ones_each_part_exports() -> None:
    assert chute.metrics.RunLockedError is errors.RunLockedError
    assert chute.metrics.WriterClosedError is errors.WriterClosedError
    assert chute.insitu.BadChunkError is errors.BadChunkError
    assert issubclass(errors.RunLockedError, RuntimeError)
    assert issubclass(errors.BadChunkError, RuntimeError)
    assert chute.ChuteError is errors.ChuteError
