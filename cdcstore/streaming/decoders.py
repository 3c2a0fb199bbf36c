"""Decoders of WebDataset-style sample members, chosen by the member's extension (pure logic).

The basic table follows WebDataset's `.decode()`: `txt`/`text` as str, `cls`/`cls2`/`index`/`inx`/`id`
as int, `json`/`jsn` parsed, `npy` as a numpy array (never unpickled), and images (`jpg`, `png`,
`webp`, ...) as PIL images when Pillow is installed (bytes otherwise). A compound extension
(`seg.png`) is decoded by its last part. Other members stay bytes; `pyd`/`pickle` members are
never unpickled (a dataset is data, not code).

Decoding is bounded (docs/streaming.md "Decode bounds"): an image over `CDCSTORE_MAX_IMAGE_PIXELS`
pixels (2**26 by default, 8192 x 8192) is refused from its header, before its pixels are decoded
(a 657 KB PNG of zeros is 644 MiB of RGBA); a row group over `CDCSTORE_MAX_DECODED_BYTES` is
refused by `cdcstore.streaming.decoded.read_row_group`. Each setting is read from the environment when used,
so DataLoader workers (forked or spawned) follow the main process's.
"""
from __future__ import annotations

import functools
import io
import json
from typing import Callable

import numpy as np

MAX_IMAGE_PIXELS = 1 << 26  # default bound of one decoded image (CDCSTORE_MAX_IMAGE_PIXELS)
IMAGES = ("jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "webp", "bmp", "tif", "tiff", "gif")


def _text(data: bytes) -> str:
    return data.decode("utf-8")


def _int(data: bytes) -> int:
    return int(data.decode("ascii").strip())


def _json(data: bytes):
    return json.loads(data)


def _npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


def _image(data: bytes, max_pixels: int = MAX_IMAGE_PIXELS):
    try:
        from PIL import Image
    except ImportError:  # without Pillow images stay bytes (docs/streaming.md)
        return data
    image = Image.open(io.BytesIO(data))  # reads the header only
    width, height = image.size
    if width * height > max_pixels:
        raise ValueError(f"a {width} x {height} image is {width * height} pixels, over the bound of {max_pixels}: "
                         f"set CDCSTORE_MAX_IMAGE_PIXELS to decode larger ones")
    image.load()
    return image


BASIC: dict[str, Callable[[bytes], object]] = {
    "txt": _text, "text": _text, "cls": _int, "cls2": _int, "index": _int, "inx": _int, "id": _int,
    "json": _json, "jsn": _json, "npy": _npy, **{e: _image for e in IMAGES}}


def table(spec: "bool | dict", max_pixels: int = MAX_IMAGE_PIXELS) -> dict[str, Callable[[bytes], object]]:
    """The decoders of a `decode=` setting: True the basic table, a dict of extension -> function
    the basic table with those replaced or added (None: keep that extension's bytes), False none.
    Images are refused past `max_pixels` (the caller's setting, CDCSTORE_MAX_IMAGE_PIXELS)."""
    basic: dict[str, Callable[[bytes], object]] = {
        **BASIC, **{e: functools.partial(_image, max_pixels=max_pixels) for e in IMAGES}}
    if spec is False:
        return {}
    if spec is True:
        return basic
    if isinstance(spec, dict):
        given: dict[str, Callable[[bytes], object] | None] = {**basic, **{str(e).lower(): f for e, f in spec.items()}}
        return {k: v for k, v in given.items() if v is not None}
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
