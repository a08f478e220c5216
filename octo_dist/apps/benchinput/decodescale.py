"""What decoding a JPEG at a reduced scale changes: libjpeg's 1/2, 1/4 or 1/8 decode (``tf.io.decode_jpeg(ratio=)``)
against the full decode resized to the same size with the fork's lanczos3 (``frames.resize_image``), held to the
bound the device's resize is held to against TensorFlow's (``frames.RESIZE_LEVELS`` on at most
``frames.RESIZE_SHARE`` of the values).

    d = decodescale.difference(jpeg_bytes, 2)      # a 512x512 JPEG: Difference(ratio=2, size=(256, 256), ...)
    d.within_bound()                              # False on photos: libjpeg's scaled inverse DCT is not lanczos3
    decodescale.words([d, ...])                    # "a 1/2-scale decode differs from ... by up to 71 levels ..."

``octo-dist bench-input`` measures it on the frames it reads (:func:`encoded_frames`), ``bench/decode_ratio.py`` on
given JPEGs, with the time of each decode.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, List, Sequence, Tuple

from octo_dist.apps.finetune import frames


@dataclasses.dataclass(frozen=True)
class Difference:
    """One image's reduced-scale decode against decode + lanczos3, in uint8 levels over every value (pixel and
    channel): the largest, the mean, the share that differ at all and the share beyond the bound's levels."""

    ratio: int
    size: Tuple[int, int]
    max_levels: int
    mean_levels: float
    share_differing: float
    share_beyond: float

    def within_bound(self) -> bool:
        """Within the resize equivalence bound: no value more than ``frames.RESIZE_LEVELS`` off, and at most
        ``frames.RESIZE_SHARE`` of them off at all (what tests/test_augment.py asserts for the device's resize)."""
        return (
            self.max_levels <= frames.RESIZE_LEVELS and self.share_differing <= frames.RESIZE_SHARE
        )


def difference(encoded: bytes, ratio: int, method: str = "lanczos3") -> Difference:
    """``encoded`` (a JPEG) decoded at ``1/ratio`` by libjpeg, against its full decode resized to that size with
    ``method`` (the size libjpeg gives: the stored size divided by ``ratio``, rounded up)."""
    import numpy as np
    import tensorflow as tf

    scaled = tf.io.decode_jpeg(encoded, channels=3, ratio=ratio).numpy()
    full = tf.io.decode_jpeg(encoded, channels=3)
    size = tuple(int(v) for v in scaled.shape[:2])
    resized = frames.resize_image(full, size, method).numpy()
    diff = np.abs(scaled.astype(np.int16) - resized.astype(np.int16))
    return Difference(
        ratio=ratio,
        size=size,
        max_levels=int(diff.max()),
        mean_levels=float(diff.mean()),
        share_differing=float((diff > 0).mean()),
        share_beyond=float((diff > frames.RESIZE_LEVELS).mean()),
    )


def words(differences: Sequence[Difference]) -> str:
    """The differences of one ratio over several images, in words: ``"a 1/2-scale JPEG decode differs from decode
    + lanczos3 by up to 71 levels (mean 5.3, 64% of values by more than 1) over 8 image(s): outside the resize's
    bound (1 level on at most 0.2% of values)"``."""
    if not differences:
        raise ValueError("no images to compare; expected at least one JPEG frame of the camera")
    ratio = differences[0].ratio
    worst = max(d.max_levels for d in differences)
    mean = sum(d.mean_levels for d in differences) / len(differences)
    beyond = sum(d.share_beyond for d in differences) / len(differences)
    inside = all(d.within_bound() for d in differences)
    bound = f"{frames.RESIZE_LEVELS} level on at most {frames.RESIZE_SHARE * 100:g}% of values"
    return (
        f"a 1/{ratio}-scale JPEG decode differs from decode + lanczos3 by up to {worst} levels (mean {mean:.1f}, "
        f"{beyond * 100:.0f}% of values by more than {frames.RESIZE_LEVELS}) over {len(differences)} image(s): "
        + (
            f"within the resize's bound ({bound})"
            if inside
            else f"outside the resize's bound ({bound})"
        )
    )


def encoded_frames(dataset, camera: str, count: int) -> List[bytes]:
    """The first ``count`` non-padding encoded images of ``observation.image_<camera>`` in a dataset of frames (each
    a window of encoded images, as Octo's trajectory transforms and ``reader.rlds_frames`` yield them)."""
    out: List[bytes] = []
    key = f"image_{camera}"
    for one in dataset.take(count * 4).as_numpy_iterator():
        images = one["observation"][key]
        out += [bytes(x) for x in _flat(images) if len(x)]
        if len(out) >= count:
            return out[:count]
    return out


def _flat(images) -> Iterable[bytes]:
    import numpy as np

    return np.asarray(images, dtype=object).reshape(-1)


def ratio_for(stored: Tuple[int, int], size: Tuple[int, int]) -> int:
    """The largest of 8, 4, 2 by which a JPEG stored at ``stored`` can be decoded and still be at least ``size``
    on both sides, else 1: ``(480, 640), (128, 128)`` -> 2; ``(512, 512), (128, 128)`` -> 4."""
    for ratio in (8, 4, 2):
        if stored[0] >= ratio * size[0] and stored[1] >= ratio * size[1]:
            return ratio
    return 1
