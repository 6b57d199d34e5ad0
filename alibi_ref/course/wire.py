"""What crosses between the grader and a graded kernel, as data: the cases' inputs in, the answer's values out.

Both ways it is JSON, arrays as their bytes (base64) with dtype and shape, never a pickle. The grader
draws the cases of every check an assignment makes and writes their inputs to one file
(``pack_cases``), which the sandbox shows each kernel read-only at the path ``GRADING_ENV`` names:
the hidden inputs come from the grader, drawn with a secret the kernel never holds. The kernel
runs the answer on them and hands the values back as one display output of MIME type ``MIME``
(``encode``), which the grader reads with ``decode``: malformed data is a ValueError, never code.
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass

import numpy as np

MIME = "application/vnd.alibi-course.check+json"
# set in a graded kernel (the autograder's sandbox): the path of the file with the cases' inputs (``pack_cases``)
GRADING_ENV = "ALIBI_COURSE_GRADING"
MAX_CASE_BYTES = 16 * 2**20
MAX_SEQUENCE = 4096  # items in a list or tuple handed back (nested lists where an array was asked for included)


# ----------------------------------------------------------------------------- the answer's values, out

def encode(value, depth: int = 0):
    """``value`` as JSON-able data: arrays and tensors as float64 bytes with dtype and device."""
    if depth > 8:
        return {"other": "a structure nested too deep"}
    if value is None or isinstance(value, bool):
        return {"scalar": value}
    if isinstance(value, str):  # a str of its own: a subclass's methods are the answer's code
        return {"scalar": str.__str__(value)}
    if isinstance(value, dict):
        return {"map": {str(k): encode(v, depth + 1) for k, v in list(value.items())[:64]}}
    if isinstance(value, (tuple, list)) and not all(isinstance(x, (int, float)) for x in value):
        if len(value) > MAX_SEQUENCE:  # not cut short: a shortened list would be judged as if it were the answer
            return {"other": f"a sequence of {len(value)} items (at most {MAX_SEQUENCE}: return an array)"}
        return {"seq": [encode(v, depth + 1) for v in value]}
    kind, device, dtype = "array", "cpu", None
    if hasattr(value, "detach") and hasattr(value, "device"):  # a torch tensor
        kind, device, dtype = "tensor", str(value.device), str(value.dtype).removeprefix("torch.")
        if value.device.type == "meta":
            return {"tensor": None, "shape": [int(n) for n in value.shape], "dtype": dtype, "device": device}
        value = value.detach().cpu().double().numpy()
    try:
        array = np.array(value, copy=True, subok=False)
        dtype = dtype or str(array.dtype)
        array = array.astype(np.float64)
    except (TypeError, ValueError):
        return {"other": type(value).__name__}
    if array.nbytes > MAX_CASE_BYTES:
        return {"other": f"an array of {array.nbytes / 2**20:.0f} MiB"}
    return {kind: base64.b64encode(array.tobytes()).decode(), "shape": list(array.shape), "dtype": dtype,
            "device": device, "python": type(value).__name__ if kind == "array" else "Tensor"}


@dataclass(frozen=True)
class Leaf:
    """A handed-back array: its values as float64 and what it was."""

    values: np.ndarray | None  # None for a meta tensor
    shape: tuple
    dtype: str
    device: str
    kind: str  # "array" or "tensor"


def decode(data):
    """The inverse of ``encode``, for data that came from an untrusted kernel: malformed data raises ValueError."""
    if not isinstance(data, dict) or len(data) == 0:
        raise ValueError("not an encoded value")
    if "scalar" in data:
        if not isinstance(data["scalar"], (bool, str, type(None))):
            raise ValueError("bad scalar")
        return data["scalar"]
    if "map" in data:
        return {str(k): decode(v) for k, v in dict(data["map"]).items()}
    if "seq" in data:
        return tuple(decode(v) for v in list(data["seq"]))
    if "other" in data:
        return Other(str(data["other"]))
    kind = "tensor" if "tensor" in data else "array"
    shape = tuple(int(n) for n in data["shape"])
    if any(n < 0 for n in shape):
        raise ValueError("negative dimension")
    if kind == "tensor" and data["tensor"] is None:
        return Leaf(None, shape, str(data["dtype"]), str(data["device"]), kind)
    raw = base64.b64decode(data[kind], validate=True)
    if len(raw) != 8 * math.prod(shape):
        raise ValueError(f"{len(raw)} bytes for shape {shape}")
    values = np.frombuffer(raw, dtype=np.float64).reshape(shape).copy()
    return Leaf(values, shape, str(data["dtype"]), str(data["device"]), kind)


@dataclass(frozen=True)
class Other:
    what: str  # a value that is not numbers


# ----------------------------------------------------------------------------- the cases' inputs, in

def pack(value):
    """One input of a case as JSON-able data that ``unpack`` turns back into the same Python value: arrays of
    any dtype by their bytes, and the containers and scalars the cases are made of."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"scalar": value} if not isinstance(value, float) or math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, np.generic):
        return {"numpy": str(value.dtype), "bytes": base64.b64encode(value.tobytes()).decode()}
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        return {"array": base64.b64encode(array.tobytes()).decode(), "dtype": str(array.dtype),
                "shape": list(array.shape)}
    if isinstance(value, (list, tuple)):
        return {"list" if isinstance(value, list) else "tuple": [pack(v) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[str(k), pack(v)] for k, v in value.items()]}
    raise TypeError(f"a case input of type {type(value).__name__} cannot be handed to a kernel")


def unpack(data):
    if "scalar" in data:
        return data["scalar"]
    if "float" in data:
        return float(data["float"])
    if "numpy" in data:
        return np.frombuffer(base64.b64decode(data["bytes"]), dtype=np.dtype(data["numpy"]))[0]
    if "array" in data:
        raw = base64.b64decode(data["array"])
        return np.frombuffer(raw, dtype=np.dtype(data["dtype"])).reshape(data["shape"]).copy()
    if "list" in data:
        return [unpack(v) for v in data["list"]]
    if "tuple" in data:
        return tuple(unpack(v) for v in data["tuple"])
    if "dict" in data:
        return {k: unpack(v) for k, v in data["dict"]}
    raise ValueError(f"not a packed case input: {sorted(data)}")


def call_key(name: str, seed: int | None) -> str:
    """How one check call (exercise, hidden seed or None) is named in the cases file."""
    return f"{name}/{'visible' if seed is None else int(seed)}"

