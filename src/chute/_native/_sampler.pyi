import numpy as np
import numpy.typing as npt

def fill(
    mode: int,
    length: int,
    batch: int,
    seed: int,
    step: int,
    first: int,
    out: npt.NDArray[np.uint64],
) -> None: ...
def fill_window(
    begins: npt.NDArray[np.uint64],
    shift: npt.NDArray[np.uint64],
    key: int,
    cycle: int,
    first: int,
    out: npt.NDArray[np.uint64],
) -> None: ...

MODE_SEQUENTIAL: int
MODE_IID: int
MODE_CYCLIC: int
