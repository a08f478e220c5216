"""Decoding JPEGs at a reduced scale (octo_dist.apps.benchinput.decodescale, bench-input's opt-in row): held to the
resize equivalence bound, measured on the frames bench-input reads, never the default where it falls outside.

Inputs are fabricated JPEGs (a flat colour, camera-like noise); the oracle is decode + ``frames.resize_image``.
"""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from test_frames import frame, jpeg, photo  # noqa: E402

from octo_dist.apps.benchinput import cli, decodescale, measure  # noqa: E402
from octo_dist.apps.finetune import frames  # noqa: E402


def difference(**fields) -> decodescale.Difference:
    base = dict(ratio=2, size=(128, 128), max_levels=0, mean_levels=0.0, share_differing=0.0)
    return decodescale.Difference(**{**base, "share_beyond": 0.0, **fields})


def test_the_bound_is_the_resizes_one_level_on_at_most_a_fifth_of_a_percent():
    assert (frames.RESIZE_LEVELS, frames.RESIZE_SHARE) == (1, 0.002)
    assert difference(max_levels=1, share_differing=0.002).within_bound()
    assert not difference(max_levels=1, share_differing=0.0021).within_bound()
    assert not difference(max_levels=2, share_differing=1e-6).within_bound()


def test_a_flat_frame_decodes_alike_at_any_scale():
    flat = jpeg(np.full((256, 256, 3), 97, np.uint8))
    for ratio in (2, 4, 8):
        d = decodescale.difference(flat, ratio)
        assert d.size == (256 // ratio, 256 // ratio)
        assert d.within_bound(), d


def test_a_camera_like_frame_decoded_at_half_scale_is_outside_the_bound():
    """Why the reduced-scale decode stays an opt-in: libjpeg's scaled inverse DCT is not lanczos3."""
    d = decodescale.difference(jpeg(photo(256, 256, 3)), 2)
    assert d.size == (128, 128)
    assert not d.within_bound()
    assert d.max_levels > frames.RESIZE_LEVELS and d.share_beyond > frames.RESIZE_SHARE
    words = decodescale.words([d])
    assert words.startswith(
        f"a 1/2-scale JPEG decode differs from decode + lanczos3 by up to {d.max_levels}"
    )
    assert words.endswith(
        "over 1 image(s): outside the resize's bound (1 level on at most 0.2% of values)"
    )
    with pytest.raises(ValueError, match="no images to compare"):
        decodescale.words([])


def source(primary: bytes, wrist: bytes) -> measure.Source:
    def make():
        one = frame([primary, b""], [wrist, wrist], goal=primary)
        return tf.data.Dataset.from_tensors(one).repeat()

    return measure.Source(make=make, octo=False, fork_transforms=None)


def test_bench_input_measures_the_scaled_decode_where_a_camera_is_stored_at_a_multiple():
    src = source(jpeg(photo(512, 512, 4)), jpeg(photo(128, 128, 5)))
    stored, sizes = (
        {"primary": (512, 512), "wrist": (128, 128)},
        {"primary": (256, 256), "wrist": (128, 128)},
    )
    lines = []
    ratios = cli.scaled_decode(src, stored, sizes, lines.append, count=3)
    # the wrist is stored at the model's size: no ratio, no line
    assert ratios == {"primary": 2}
    assert len(lines) == 1 and lines[0].startswith(
        "primary: stored at 2x the model's size; a 1/2-scale JPEG"
    )
    assert "over 3 image(s): outside the resize's bound" in lines[0]
    assert "FrameTransforms.decode_ratio is an opt-in" in lines[0]

    config = {"frame_transform_kwargs": {"resize_size": sizes}}
    batches = measure.pipelines(src, config, 2, 4, stored=stored, decode_ratio=ratios)
    scaled = next(iter(batches["device-resize-scaled"].as_numpy_iterator()))
    full = next(iter(batches["device-resize"].as_numpy_iterator()))
    assert scaled["observation"]["image_primary"].shape == (2, 2, 256, 256, 3)
    assert full["observation"]["image_primary"].shape == (2, 2, 512, 512, 3)
    # padding at the shipped size
    assert not scaled["observation"]["image_primary"][:, 1].any()


def test_the_report_puts_the_opt_in_row_beside_the_device_resize_and_skips_it_with_its_reason():
    medians = {
        "rest": 1e-4,
        "decode": 1.6e-3,
        "resize": 5e-3,
        "augment": 9e-3,
        "device-resize": 2e-3,
    }
    kwargs = dict(
        gpu_rate=3671, basis="at 40%", model="Octo-Small", cores_per_node=96, gpus_per_node=8
    )
    lines = cli.report(medians, {"rest": 1e-4}, **kwargs)
    assert lines[2] == (
        f"{cli.LABELS['device-resize-scaled']:<60} skipped: no camera's frames stored at 2x, 4x or 8x the "
        "model's size"
    )
    lines = cli.report({**medians, "device-resize-scaled": 1e-3}, {"rest": 1e-4}, **kwargs)
    assert lines[2].startswith(cli.LABELS["device-resize-scaled"]) and "1000.0" in lines[2]
    assert any(
        line.startswith(f"verdict, {cli.LABELS['device-resize-scaled']}: feeds") for line in lines
    )
