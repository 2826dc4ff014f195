"""Decoding, validating and downscaling client images before they reach the vision encoder.

Image tokens dominate time to first token, so every image is downscaled to a pixel budget (long side,
aspect kept). Hostile inputs (truncated files, bombs, odd modes) become 400s that say what to fix.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from service.engine.errors import APIError

FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP")
MAX_ASPECT = 200  # Qwen-VL's image processor refuses more elongated images


@dataclass(frozen=True)
class PreparedImage:
    """RGB pixels (1, H, W, 3) uint8, as VLMPipeline wants them, and a hash of those pixels."""

    pixels: np.ndarray
    digest: str
    original_size: tuple[int, int]

    @property
    def size(self) -> tuple[int, int]:
        return int(self.pixels.shape[2]), int(self.pixels.shape[1])


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int
    max_pixels: int
    max_side: int  # downscale target for the long side; 0 = keep


def decode_data_url(url: str, param: str) -> bytes:
    head, sep, payload = url.partition(",")
    if not sep or not head.startswith("data:") or ";base64" not in head:
        raise APIError("image_url must be a data URL like 'data:image/png;base64,...'", param=param,
                       code="invalid_image_url")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise APIError("image data URL is not valid base64", param=param, code="invalid_image") from None


def prepare(data: bytes, limits: ImageLimits, param: str = "image") -> PreparedImage:
    """Validate ``data`` as an image within ``limits`` and return it downscaled, as RGB pixels."""
    if not data:
        raise APIError("image is empty (0 bytes)", param=param, code="invalid_image")
    if len(data) > limits.max_bytes:
        raise APIError(f"image is {len(data)} bytes; the limit is {limits.max_bytes} bytes", status=413,
                       param=param, code="image_too_large")
    image = _open(data, limits, param)
    original = image.size
    image = _to_rgb(image, param)
    if limits.max_side and max(image.size) > limits.max_side:
        image = ImageOps.contain(image, (limits.max_side, limits.max_side), Image.Resampling.BICUBIC)
    pixels = np.ascontiguousarray(np.asarray(image, dtype=np.uint8)[None])
    return PreparedImage(pixels, hashlib.sha256(pixels.tobytes() + bytes(str(pixels.shape), "ascii")).hexdigest(),
                         original)


def _open(data: bytes, limits: ImageLimits, param: str) -> Image.Image:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            if image.format not in FORMATS:
                raise APIError(f"image format {image.format} is not supported; send one of {', '.join(FORMATS)}",
                               status=415, param=param, code="unsupported_image_format")
            width, height = image.size
            if width * height > limits.max_pixels:
                raise APIError(f"image is {width}x{height} pixels; the limit is {limits.max_pixels} pixels in all",
                               status=413, param=param, code="image_too_large")
            if width < 1 or height < 1:
                raise APIError("image has no pixels", param=param, code="invalid_image")
            if max(width, height) > MAX_ASPECT * min(width, height):
                raise APIError(f"image is {width}x{height}: its aspect ratio is over {MAX_ASPECT}:1, the model's "
                               "limit; crop or pad it", param=param, code="invalid_image")
            image.seek(0)  # animated images: the first frame is the image
            image.load()
            return image
    except APIError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise APIError("image expands to too many pixels (decompression bomb guard)", status=413, param=param,
                       code="image_too_large") from None
    except UnidentifiedImageError:
        raise APIError(f"could not decode the image: not one of {', '.join(FORMATS)}", status=415, param=param,
                       code="unsupported_image_format") from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        raise APIError(f"could not decode the image (truncated or corrupt): {e}", param=param,
                       code="invalid_image") from None


def _to_rgb(image: Image.Image, param: str) -> Image.Image:
    try:
        if image.mode in ("I;16", "I;16B", "I;16L", "I"):
            # 16/32-bit greyscale: scale to 8 bits rather than clip to white.
            array = np.asarray(image, dtype=np.float64)
            top = array.max() or 1.0
            image = Image.fromarray((array * (255.0 / top)).astype(np.uint8), "L")
        if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
            background = Image.new("RGB", image.size, (255, 255, 255))
            background.paste(image.convert("RGBA"), mask=image.convert("RGBA").getchannel("A"))
            return background
        return image.convert("RGB")
    except (OSError, ValueError) as e:
        raise APIError(f"could not convert the image to RGB: {e}", param=param, code="invalid_image") from None
