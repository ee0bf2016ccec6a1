"""OIP datatype → numpy dtype, for backends (kept here so accelerators import no wire code)."""

from __future__ import annotations

import numpy as np


def numpy_dtype_for(datatype: str) -> np.dtype:
    """numpy dtype of an OIP datatype (BF16 via ml_dtypes, BYTES as object).

    Raises:
        KeyError: unknown datatype.
    """
    if datatype == "BF16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(_MAP[datatype])


_MAP = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
    "FP32": np.float32, "FP64": np.float64, "BYTES": object,
}
