"""Decoders of WebDataset-style sample members, chosen by the member's extension (pure logic).

The basic table follows WebDataset's `.decode()`: `txt`/`text` as str, `cls`/`cls2`/`index`/`inx`/`id`
as int, `json`/`jsn` parsed, `npy` as a numpy array (never unpickled), and images (`jpg`, `png`,
`webp`, ...) as PIL images when Pillow is installed (bytes otherwise). A compound extension
(`seg.png`) is decoded by its last part. Other members stay bytes; `pyd`/`pickle` members are
never unpickled (a dataset is data, not code).
"""
from __future__ import annotations

import io
import json
from typing import Callable

import numpy as np

IMAGES = ("jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "webp", "bmp", "tif", "tiff", "gif")


def _text(data: bytes) -> str:
    return data.decode("utf-8")


def _int(data: bytes) -> int:
    return int(data.decode("ascii").strip())


def _json(data: bytes):
    return json.loads(data)


def _npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


def _image(data: bytes):
    try:
        from PIL import Image
    except ImportError:  # without Pillow images stay bytes (docs/streaming.md)
        return data
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


BASIC: dict[str, Callable[[bytes], object]] = {
    "txt": _text, "text": _text, "cls": _int, "cls2": _int, "index": _int, "inx": _int, "id": _int,
    "json": _json, "jsn": _json, "npy": _npy, **{e: _image for e in IMAGES}}


def table(spec: "bool | dict") -> dict[str, Callable[[bytes], object]]:
    """The decoders of a `decode=` setting: True the basic table, a dict of extension -> function
    the basic table with those replaced or added (None: keep that extension's bytes), False none."""
    if spec is False:
        return {}
    if spec is True:
        return dict(BASIC)
    if isinstance(spec, dict):
        return {k: v for k, v in {**BASIC, **{str(e).lower(): f for e, f in spec.items()}}.items() if v is not None}
    raise ValueError(f"decode must be True, False or a dict of extension -> function, not {spec!r}")


def decode_sample(sample: dict, decoders: dict) -> dict:
    """`sample` with each member whose extension has a decoder decoded; a member that does not
    decode raises ValueError naming the sample, the member and the way out."""
    out = {}
    for name, data in sample.items():
        fn = decoders.get(name.rsplit(".", 1)[-1].lower()) if name != "__key__" and data is not None else None
        if fn is None:
            out[name] = data
            continue
        try:
            out[name] = fn(data)
        except Exception as e:  # noqa: BLE001 - any decoder's failure becomes one clear error
            raise ValueError(f"sample {sample.get('__key__')!r}: its {name!r} member does not decode "
                             f"({type(e).__name__}: {e}); pass decode=False for raw bytes, or "
                             f"decode={{{name!r}: your_function}}") from None
    return out
