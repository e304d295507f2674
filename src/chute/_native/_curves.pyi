import numpy as np
import numpy.typing as npt

def ema(
    values: npt.NDArray[np.float64],
    factor: float,
    acc: float,
    weight: float,
    out: npt.NDArray[np.float64],
    at: npt.NDArray[np.int64] | None,
) -> tuple[float, float]: ...
def extremes(
    y: npt.NDArray[np.float64], starts: npt.NDArray[np.int64], out: npt.NDArray[np.int64]
) -> int: ...
