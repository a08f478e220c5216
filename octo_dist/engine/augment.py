"""Octo's image augmentation on the device: dlimp's ``augment_image`` ops inside the jitted train step.

    augmenter = augment.batch_augmenter(config["frame_transform_kwargs"]["image_augment_kwargs"])
    batch = augmenter(batch, key)      # inside jit: every image_<name> of observation and task, per sample

The fork's pipeline augments each frame on the host with TensorFlow (random resized crop, brightness, contrast,
saturation, hue, in ``augment_order``), a quarter of the host's time per sample. Here the same ops run on the batch
the step already holds, on the accelerator, each one a deterministic function of its parameters (a crop box, a
factor) checked pixel for pixel against the TensorFlow op it replaces (``tests/test_augment.py``), and one sampler,
:func:`draw`, that draws those parameters as dlimp does:

* dlimp converts the image to float in [0, 1] (``tf.image.convert_image_dtype``: uint8 x 1/255), applies the ops in
  ``augment_order``, clips to [0, 1] after each, and converts back (``x * 255.5``, saturated, truncated to uint8).
  The model gets uint8 images either way (Octo's encoders scale them to [-1, 1]).
* dlimp hands every op the same stateless seed, and ``tf.random.stateless_uniform`` gives the same number for the
  same seed: ONE uniform ``u`` in [0, 1) sets every parameter of an image. Brightness delta ``-d + 2*d*u``, contrast
  ``lower + (upper - lower)*u``, and so on; the crop's scale, log-ratio and both offsets all come from that ``u``
  (a crop with a large scale is also a crop towards the bottom right). :func:`draw` keeps that coupling: the
  distribution is dlimp's, not the one its docs suggest.
* Octo (``apply_frame_transforms``) draws one seed per sample and applies it to every frame of the observation
  window and to the task's goal image alike, adding the camera's index to its seed: within a sample, every frame
  of one camera gets the same crop and colours; the cameras get independent draws. So here: one key per sample
  (``fold_in(key, global sample index)``: the same draws whatever the device count), one per camera
  (``fold_in(sample key, crc32(camera name))``), shared by the window and the goal image.
* Padding images (``pad_mask_dict["image_<name>"]`` false: a missing camera's all-zero frame) stay as they are, as
  Octo's ``tf.cond`` leaves them.

Every op works on ``[..., H, W, C]`` float images; leading axes (a window) share the op's parameters.
"""

from __future__ import annotations

import zlib
from typing import Any, Callable, Mapping, Optional

import jax
import jax.numpy as jnp

from octo_dist.engine.stepfns import DEVICE_OPS, augment_problems, op_arguments

Params = Mapping[str, jax.Array]
IMAGE_PREFIX = "image_"  # Octo's observation and task dicts: image_primary, image_wrist, ...
PAD_MASKS = "pad_mask_dict"  # {"image_primary": bool [B, window] (observation) or [B] (task)}


# --- the [0, 1] float conversion dlimp does around the ops ---------------------------------------------------------


def to_unit(image: jax.Array) -> jax.Array:
    """uint8 -> float32 in [0, 1] as ``tf.image.convert_image_dtype`` does (x * float32(1/255)); float is kept."""
    if image.dtype == jnp.uint8:
        return image.astype(jnp.float32) * jnp.float32(1.0 / 255.0)
    return image.astype(jnp.float32)


def from_unit(image: jax.Array, dtype) -> jax.Array:
    """float in [0, 1] -> ``dtype`` as ``convert_image_dtype(..., saturate=True)`` does: uint8 is ``x * 255.5``
    clipped to [0, 255] and truncated (0.999 -> 255, 0.5 -> 127); float is kept."""
    if jnp.dtype(dtype) == jnp.uint8:
        return jnp.clip(image * jnp.float32(255.5), 0.0, 255.0).astype(jnp.uint8)
    return image.astype(dtype)


# --- the ops: deterministic functions of their parameters ----------------------------------------------------------


def _lerp_axis(image: jax.Array, lo: float, hi: float, axis: int):
    """Source coordinates, neighbours and weights along one axis of ``tf.image.crop_and_resize`` (bilinear) for
    the box edges ``lo``..``hi`` (normalised) and an output as long as the input."""
    n = image.shape[axis]
    if n > 1:
        scale = (hi - lo) * jnp.float32(n - 1) / jnp.float32(n - 1)
        where = lo * jnp.float32(n - 1) + jnp.arange(n, dtype=jnp.float32) * scale
    else:
        where = jnp.full((1,), 0.5 * (lo + hi) * jnp.float32(n - 1), jnp.float32)
    # TensorFlow fills rows (columns) outside the image with 0 (extrapolation_value)
    inside = (where >= 0) & (where <= n - 1)
    first = jnp.floor(where)
    low = jnp.clip(first, 0, n - 1).astype(jnp.int32)
    high = jnp.clip(jnp.ceil(where), 0, n - 1).astype(jnp.int32)
    return low, high, where - first, inside


def crop_and_resize(image: jax.Array, box: jax.Array) -> jax.Array:
    """``tf.image.crop_and_resize(image, [box], [0], (H, W))``, bilinear: the crop ``box = (y1, x1, y2, x2)``
    (normalised to [0, 1]) of a float ``[..., H, W, C]`` image, resized back to ``H x W``.

    Same arithmetic as TensorFlow's CPU kernel: source row ``y1*(H-1) + i*(y2-y1)*(H-1)/(H-1)``, interpolated
    along x first (``top = tl + (tr - tl)*dx``), then y; rows or columns that fall outside the image are 0."""
    y1, x1, y2, x2 = box[0], box[1], box[2], box[3]
    top, bottom, dy, rows_in = _lerp_axis(image, y1, y2, -3)
    left, right, dx, cols_in = _lerp_axis(image, x1, x2, -2)

    def along_x(rows):
        left_of, right_of = jnp.take(rows, left, axis=-2), jnp.take(rows, right, axis=-2)
        return left_of + (right_of - left_of) * dx[:, None]

    upper = along_x(jnp.take(image, top, axis=-3))
    lower = along_x(jnp.take(image, bottom, axis=-3))
    out = upper + (lower - upper) * dy[:, None, None]
    return jnp.where(rows_in[:, None, None] & cols_in[None, :, None], out, 0.0)


def _interpolation_matrix(lo, hi, n: int) -> jax.Array:
    """``[n, n]`` float32: row i holds the two weights :func:`_lerp_axis` gives output i (``1 - d`` at its lower
    source, ``d`` at its upper; one weight of 1 where they coincide), a row of zeros where it falls outside."""
    low, high, frac, inside = _lerp_axis(jnp.zeros((n, 1, 1)), lo, hi, -3)
    source = jnp.arange(n)[None, :]
    weights = (source == low[:, None]) * (1.0 - frac)[:, None] + (source == high[:, None]) * frac[
        :, None
    ]
    return jnp.where(inside[:, None], weights, 0.0).astype(jnp.float32)


def crop_and_resize_matmul(image: jax.Array, box: jax.Array) -> jax.Array:
    """:func:`crop_and_resize` as two products with interpolation matrices (rows, then columns), for TPUs: their
    gathers are slow and their matrix units fast. One v5e chip, a batch of 64 window-2 256x256 frames: 6.8 ms with
    the gathers, 1.5 ms this way (``bench/augment.py --platform tpu``). Full float32 precision (TPUs otherwise
    multiply in bfloat16): the same pixels as the gathers to 2e-7, TensorFlow's to its rounding; on a CPU about 3x
    slower than the gathers."""
    height, width = image.shape[-3], image.shape[-2]
    rows = _interpolation_matrix(box[0], box[2], height)
    cols = _interpolation_matrix(box[1], box[3], width)
    highest = jax.lax.Precision.HIGHEST
    out = jnp.einsum("oh,...hwc->...owc", rows, image, precision=highest)
    return jnp.einsum("pw,...owc->...opc", cols, out, precision=highest)


# How the crop is resampled, by platform (resampling_for): the gathers everywhere but on TPUs.
RESAMPLERS: Mapping[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "gather": crop_and_resize,
    "matmul": crop_and_resize_matmul,
}


def resampling_for(platform: str) -> str:
    """``"matmul"`` on ``"tpu"``, else ``"gather"`` (CPUs: 3x cheaper; GPUs read the four neighbours at memory
    speed, where the products would cost more arithmetic than the gathers cost reads)."""
    return "matmul" if platform == "tpu" else "gather"


def adjust_brightness(image: jax.Array, delta) -> jax.Array:
    """``tf.image.adjust_brightness`` on a float image: ``image + delta``."""
    return image + delta


def adjust_contrast(image: jax.Array, factor) -> jax.Array:
    """``tf.image.adjust_contrast``: each channel of each frame moved away from its mean over H x W by ``factor``."""
    mean = jnp.mean(image, axis=(-3, -2), keepdims=True)
    return (image - mean) * factor + mean


def _max_min(rgb: jax.Array):
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    return r, g, b, jnp.maximum(r, jnp.maximum(g, b)), jnp.minimum(r, jnp.minimum(g, b))


def adjust_saturation(image: jax.Array, factor) -> jax.Array:
    """``tf.image.adjust_saturation``: HSV saturation ``(max - min) / max`` times ``factor``, clipped to [0, 1],
    value (the max) and hue kept.

    TensorFlow converts to HSV and back; with hue and value fixed each channel is ``max - (max - x) * s'/s``, so
    the same pixels come from a few elementwise ops (over 10x less time on a CPU than the round trip, the same to
    float32 rounding): ``s'/s = min(factor, max / (max - min))``, and grey pixels (max == min) stay as they are."""
    *_, high, low = _max_min(image)
    spread = high - low
    grey = spread <= 0
    stretch = jnp.minimum(factor, high / jnp.where(grey, 1.0, spread))
    stretch = jnp.where(grey, 1.0, stretch)[..., None]
    return high[..., None] - (high[..., None] - image) * stretch


def _wrap6(x):
    """``x`` mod 6 for ``x`` in [-6, 12)."""
    return jnp.where(x < 0, x + 6.0, jnp.where(x >= 6.0, x - 6.0, x))


# Where each channel's value sits on the colour circle (hue in sextants, [0, 6)): red at 5, green 3, blue 1.
_CHANNEL_OFFSETS = (5.0, 3.0, 1.0)


def adjust_hue(image: jax.Array, delta) -> jax.Array:
    """``tf.image.adjust_hue``: the hue turned by ``delta`` (a fraction of the colour circle); each pixel's max and
    min are kept, as TensorFlow's kernel keeps them, and its middle channel moves along the circle.

    Hue in sextants: ``(g - b) / (max - min)`` (mod 6) where red is the max, ``+ 2`` from ``(b - r)`` where green
    is, ``+ 4`` from ``(r - g)`` where blue is; back to a channel ``c`` by ``max - (max - min) * clip(min(k, 4 - k),
    0, 1)``, ``k = (offset_c + hue) mod 6``."""
    r, g, b, high, low = _max_min(image)
    spread = high - low
    red, green = r == high, g == high
    turn = jnp.where(red, g - b, jnp.where(green, b - r, r - g))
    start = jnp.where(red, 0.0, jnp.where(green, 2.0, 4.0))
    hue = turn / jnp.where(spread > 0, spread, 1.0) + start
    # one wrap each is enough (and cheaper than a float mod): hue + 6*delta is in [-4, 9) for |delta| <= 0.5
    hue = _wrap6(_wrap6(hue) + delta * 6.0)
    k = _wrap6(jnp.asarray(_CHANNEL_OFFSETS, jnp.float32) + hue[..., None])
    return high[..., None] - spread[..., None] * jnp.clip(jnp.minimum(k, 4.0 - k), 0.0, 1.0)


# --- the parameters, drawn as dlimp draws them ---------------------------------------------------------------------


def crop_box(u, scale, ratio) -> jax.Array:
    """dlimp's ``random_resized_crop`` box ``(y1, x1, y2, x2)`` for its uniform draw ``u``: scale and log-ratio
    uniform in their ranges, height ``sqrt(scale/ratio)`` and width ``sqrt(scale*ratio)`` clipped to 1, offsets
    uniform in what is left, all from the same ``u`` (u = 0.5, scale [0.8, 1], ratio [0.9, 1.1] -> about
    (0.013, 0.013, 0.962, 0.962))."""
    f32 = jnp.float32
    s = u * (f32(scale[1]) - f32(scale[0])) + f32(scale[0])
    log_lo, log_hi = jnp.log(f32(ratio[0])), jnp.log(f32(ratio[1]))
    r = jnp.exp(u * (log_hi - log_lo) + log_lo)
    height = jnp.clip(jnp.sqrt(s / r), 0.0, 1.0)
    width = jnp.clip(jnp.sqrt(s * r), 0.0, 1.0)
    y1, x1 = u * (1 - height), u * (1 - width)
    return jnp.stack([y1, x1, y1 + height, x1 + width])


def params_from_uniform(u, kwargs: Mapping[str, Any]) -> dict:
    """Every parameter of ``kwargs``' ops from dlimp's one uniform draw ``u`` in [0, 1) (module docstring):
    ``{"random_brightness": delta, ..., "random_resized_crop": box}``, as ``tf.random.stateless_uniform`` maps it
    onto each op's range (``low + u * (high - low)``)."""
    out = {}
    for op in kwargs["augment_order"]:
        args = op_arguments(op, kwargs[op])
        if op == "random_resized_crop":
            out[op] = crop_box(u, args["scale"], args["ratio"])
        elif op in ("random_brightness", "random_hue"):
            lo, hi = jnp.float32(-args["max_delta"]), jnp.float32(args["max_delta"])
            out[op] = u * (hi - lo) + lo
        else:
            lo, hi = jnp.float32(args["lower"]), jnp.float32(args["upper"])
            out[op] = u * (hi - lo) + lo
    return out


def draw(key: jax.Array, kwargs: Mapping[str, Any]) -> dict:
    """One image's parameters for ``kwargs`` (one camera's ``image_augment_kwargs``): one uniform from ``key``."""
    return params_from_uniform(jax.random.uniform(key, (), jnp.float32), kwargs)


APPLY: Mapping[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "random_resized_crop": crop_and_resize,
    "random_brightness": adjust_brightness,
    "random_contrast": adjust_contrast,
    "random_saturation": adjust_saturation,
    "random_hue": adjust_hue,
}
assert set(APPLY) == set(DEVICE_OPS)


def apply(image: jax.Array, params: Params, order, resample: str = "gather") -> jax.Array:
    """The ops of ``order`` on one image (``[..., H, W, C]``, uint8 or float in [0, 1]) with ``params``, as dlimp's
    ``augment_image``: to [0, 1] float, each op then a clip to [0, 1], back to the image's dtype. ``resample``: the
    crop's implementation (:data:`RESAMPLERS`)."""
    ops = {**APPLY, "random_resized_crop": RESAMPLERS[resample]}
    x = to_unit(image)
    for op in order:
        x = jnp.clip(ops[op](x, params[op]), 0.0, 1.0)
    return from_unit(x, image.dtype)


# --- the resize to the model's size: the host decodes, the step resizes ------------------------------------------

RESIZE_METHODS = (
    "lanczos3",
    "bilinear",
)  # the config's resize_method: lanczos3 (the fork's), bilinear (opt-in)


def resize(images: jax.Array, size, method: str = "lanczos3") -> jax.Array:
    """uint8 ``[..., H, W, C]`` -> uint8 ``[..., h, w, C]``: dlimp's ``resize_image`` (``tf.image.resize(...,
    method, antialias=True)``, rounded, clipped) on the device; leading axes (a window) are not resampled.

    ``jax.image.resize`` with ``antialias=True`` is TensorFlow's ``scale_and_translate`` kernel (the same
    lanczos3 weights, the kernel widened by the scale when shrinking), computed as products with weight matrices
    at full float32 precision (TPUs otherwise multiply in bfloat16): the same pixels as TensorFlow's resize to one
    uint8 level (``tests/test_augment.py`` bounds it). An image already at ``size`` is returned as it is."""
    size = (int(size[0]), int(size[1]))
    if tuple(images.shape[-3:-1]) == size:
        return images
    shape = (*images.shape[:-3], *size, images.shape[-1])
    out = jax.image.resize(images.astype(jnp.float32), shape, method=method, antialias=True)
    return jnp.clip(jnp.round(out), 0.0, 255.0).astype(jnp.uint8)


def resize_batch(batch: Mapping, sizes: Mapping[str, Any], method: str = "lanczos3") -> dict:
    """``batch`` with each ``image_<camera>`` of ``observation`` and ``task`` resized to ``sizes[camera]``
    (``{"primary": (256, 256), "wrist": (128, 128)}``) where its size differs; cameras not named, and every other
    leaf, pass through. Padding images (zeros) stay zeros."""
    out = dict(batch)
    for g in ("observation", "task"):
        if not isinstance(batch.get(g), Mapping):
            continue
        group = dict(batch[g])
        for key, images in batch[g].items():
            name = key[len(IMAGE_PREFIX) :] if key.startswith(IMAGE_PREFIX) else None
            if name in sizes and sizes[name] is not None:
                group[key] = resize(images, sizes[name], method)
        out[g] = group
    return out


def resize_on_host(batch: Mapping, sizes: Mapping[str, Any], method: str = "lanczos3") -> Any:
    """A host batch (numpy leaves) resized as the step resizes it (:func:`resize_batch`), back as numpy: the
    example the model's parameters are initialised on and saved with, at the model's sizes. ``batch`` itself
    where ``sizes`` is empty (nothing to resize)."""
    import numpy as np

    if not sizes:
        return batch
    out = jax.jit(lambda b: resize_batch(b, sizes, method))(batch)
    return jax.tree_util.tree_map(np.asarray, out)


def output_spec(augmenter: Callable[[Mapping, jax.Array], Any], spec: Any) -> Any:
    """The batch the step's loss sees for a batch of ``spec``'s shapes (``jax.ShapeDtypeStruct`` leaves):
    ``augmenter``'s output shapes, traced, nothing computed. Frames shipped at 64x64 and resized to 256x256 by the
    augmenter: ``image_primary`` ``(8, 2, 64, 64, 3)`` -> ``(8, 2, 256, 256, 3)``; shardings are not kept."""
    return jax.eval_shape(augmenter, spec, jax.random.PRNGKey(0))


# --- a batch: per-sample, per-camera keys; padding images left alone -----------------------------------------------


def sample_keys(key: jax.Array, batch_size: int) -> jax.Array:
    """One key per sample of the global batch: ``fold_in(key, i)``, so sample i's draws do not depend on how the
    batch is split over devices or processes."""
    return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(batch_size, dtype=jnp.uint32))


def camera_salt(name: str) -> int:
    """A camera's stream within a sample's key: ``crc32("primary") & 0x7fffffff``, stable across runs and the same
    whichever other cameras the batch has."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def per_camera(image_augment_kwargs: Mapping, names) -> dict:
    """``{camera: its kwargs}`` for the cameras ``names`` (``"primary"``...): Octo's rule, one dict with
    ``augment_order`` for every camera, else a dict per camera (missing cameras are not augmented)."""
    if "augment_order" in image_augment_kwargs:
        return {n: image_augment_kwargs for n in names}
    return {n: image_augment_kwargs[n] for n in names if n in image_augment_kwargs}


def _augment_images(group: Mapping, params: Mapping[str, Params], orders, resample: str) -> dict:
    """One of the batch's observation or task dicts with each camera's images augmented, padding images kept."""
    out = dict(group)
    masks = group.get(PAD_MASKS, {})
    for name, p in params.items():
        key = IMAGE_PREFIX + name
        if key not in group:
            continue
        images = group[key]
        augmented = jax.vmap(lambda img, q: apply(img, q, orders[name], resample))(images, p)
        present = masks.get(key)
        if present is not None:
            present = jnp.reshape(present, present.shape + (1,) * (images.ndim - present.ndim))
            augmented = jnp.where(present, augmented, images)
        out[key] = augmented
    return out


def augment_batch(
    batch: Mapping, key: jax.Array, image_augment_kwargs: Mapping, resample: str = "gather"
) -> dict:
    """``batch`` (Octo's layout: ``observation`` and ``task`` dicts of ``image_<camera>`` arrays ``[B, window, H, W,
    C]`` and ``[B, H, W, C]``, their ``pad_mask_dict``) with its images augmented as Octo's pipeline augments them;
    every other leaf is passed through. Traceable; elementwise per sample (nothing crosses samples)."""
    groups = [g for g in ("observation", "task") if isinstance(batch.get(g), Mapping)]
    names = sorted(
        {k[len(IMAGE_PREFIX) :] for g in groups for k in batch[g] if k.startswith(IMAGE_PREFIX)}
    )
    kwargs = per_camera(image_augment_kwargs, names)
    if not kwargs:
        return dict(batch)
    size = next(
        batch[g][IMAGE_PREFIX + n].shape[0]
        for g in groups
        for n in kwargs
        if IMAGE_PREFIX + n in batch[g]
    )
    keys = sample_keys(key, size)
    params = {
        name: jax.vmap(
            lambda k, kw=kw, name=name: draw(jax.random.fold_in(k, camera_salt(name)), kw)
        )(keys)
        for name, kw in kwargs.items()
    }
    orders = {name: tuple(kw["augment_order"]) for name, kw in kwargs.items()}
    out = dict(batch)
    for g in groups:
        out[g] = _augment_images(batch[g], params, orders, resample)
    return out


def batch_augmenter(
    image_augment_kwargs: Mapping,
    resample: str = "gather",
    sizes: Optional[Mapping[str, Any]] = None,
    resize_method: str = "lanczos3",
) -> Callable[[Mapping, jax.Array], dict]:
    """``(batch, key) -> batch`` for the train step: the images resized to ``sizes`` (:func:`resize_batch`: the
    host left them at their stored size) then :func:`augment_batch` with the config's kwargs, checked now (a
    ValueError naming every problem: an op the step does not implement, a range TensorFlow would refuse)."""
    plain = _plain(image_augment_kwargs or {})
    problems = augment_problems(plain)
    if problems:
        raise ValueError("image_augment_kwargs: " + "; ".join(problems))
    if resample not in RESAMPLERS:
        raise ValueError(f"resample {resample!r}; expected one of {sorted(RESAMPLERS)}")
    if resize_method not in RESIZE_METHODS:
        raise ValueError(f"resize_method {resize_method!r}; expected one of {RESIZE_METHODS}")
    targets = {name: tuple(size) for name, size in (sizes or {}).items() if size is not None}

    def augmenter(batch, key):
        if targets:
            batch = resize_batch(batch, targets, resize_method)
        return augment_batch(batch, key, plain, resample)

    return augmenter


def _plain(value):
    """A config's nested mappings and tuples as plain dicts and lists (a FrozenConfigDict holds tuples)."""
    if hasattr(value, "items"):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
