#!/usr/bin/env python3
"""Image augmentation throughput: the train step's (JAX, octo_dist/engine/augment.py) against the fork's host path
(TensorFlow's tf.image ops per frame in tf.data, as dlimp's augment_image runs them), side by side in one run.

The batch is the fine-tune's window-2 + wrist layout (finetune_config.py's image_augment_kwargs): a primary camera
at 256x256 (random resized crop, brightness, contrast, saturation, hue) and a wrist camera at 128x128 (the colour
ops), uint8, plus goal images. Both sides run on the same CPU cores (``--cores``, default 1: the process pins
itself to them before JAX and TensorFlow start their thread pools), so the figures are samples per second per
core. JAX runs the whole batch at once, as the step does; TensorFlow maps one sample at a time, as tf.data does.
Prints; asserts nothing. A TPU or GPU can time the JAX side too (``--platform``, no TensorFlow then).

usage: bench/augment.py [--batch 64] [--rounds 5] [--cores 1] [--platform cpu|tpu|gpu] [--host-samples 64]
"""

import argparse
import os
import statistics
import sys
import time

PRIMARY = {
    "random_resized_crop": {"scale": [0.8, 1.0], "ratio": [0.9, 1.1]},
    "random_brightness": [0.1],
    "random_contrast": [0.9, 1.1],
    "random_saturation": [0.9, 1.1],
    "random_hue": [0.05],
    "augment_order": [
        "random_resized_crop",
        "random_brightness",
        "random_contrast",
        "random_saturation",
        "random_hue",
    ],
}
WRIST = {
    "random_brightness": [0.1],
    "random_contrast": [0.9, 1.1],
    "random_saturation": [0.9, 1.1],
    "random_hue": [0.05],
    "augment_order": ["random_brightness", "random_contrast", "random_saturation", "random_hue"],
}
KWARGS = {"primary": PRIMARY, "wrist": WRIST}
SIZES = {"primary": 256, "wrist": 128}
WINDOW = 2


def fake_batch(size: int, seed: int = 0, stored=None) -> dict:
    """Octo's layout: window-2 uint8 frames per camera, a goal image per camera, every image present; at the
    model's sizes, or every camera at ``stored`` (a side: the frames as a dataset stores them, for the step to
    resize)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    obs, task = {"pad_mask_dict": {}}, {"pad_mask_dict": {}}
    for cam, side in SIZES.items():
        side = stored or side
        frames = rng.integers(0, 256, (size, WINDOW, side, side, 3), dtype=np.uint8)
        obs[f"image_{cam}"], task[f"image_{cam}"] = frames, frames[:, -1].copy()
        obs["pad_mask_dict"][f"image_{cam}"] = np.ones((size, WINDOW), bool)
        task["pad_mask_dict"][f"image_{cam}"] = np.ones((size,), bool)
    return {"observation": obs, "task": task}


def time_device(batch: dict, rounds: int, resize: bool = False) -> list:
    """Seconds per batch of the step's augmentation (compiled once, then ``rounds`` batches, each a new key);
    ``resize``: the step first resizes the batch's images to the model's sizes (lanczos3, antialiased)."""
    import jax

    from octo_dist.engine import augment

    # as the fine-tune builds it for these devices (a TPU resamples the crop with matrix products)
    platform = jax.devices()[0].platform
    sizes = {cam: (side, side) for cam, side in SIZES.items()} if resize else None
    fn = jax.jit(
        augment.batch_augmenter(KWARGS, resample=augment.resampling_for(platform), sizes=sizes)
    )
    on_device = jax.device_put(batch)
    jax.block_until_ready(fn(on_device, jax.random.PRNGKey(0)))  # compile
    times = []
    for r in range(rounds):
        start = time.perf_counter()
        jax.block_until_ready(fn(on_device, jax.random.PRNGKey(r + 1)))
        times.append(time.perf_counter() - start)
    return times


def host_augment_fn():
    """One sample as the fork augments it on the host: per camera a seed, every frame of the window and the goal
    image with it, each tf.image op of augment_order with that seed, a clip after each, uint8 <-> [0, 1] float."""
    import tensorflow as tf

    def crop(x, seed, scale, ratio):
        draw = lambda lo, hi: tf.random.stateless_uniform((1,), seed, lo, hi)  # noqa: E731
        s = draw(scale[0], scale[1])
        r = tf.exp(draw(tf.math.log(ratio[0]), tf.math.log(ratio[1])))
        h, w = tf.clip_by_value(tf.sqrt(s / r), 0, 1), tf.clip_by_value(tf.sqrt(s * r), 0, 1)
        y, x0 = draw(0, 1 - h), draw(0, 1 - w)
        box = tf.stack([y, x0, y + h, x0 + w], axis=1)
        return tf.image.crop_and_resize(x[None], box, [0], tf.shape(x)[:2])[0]

    def one_image(img, seed, kwargs):
        x = tf.image.convert_image_dtype(img, tf.float32)
        for op in kwargs["augment_order"]:
            args = kwargs[op]
            if op == "random_resized_crop":
                x = crop(x, seed, args["scale"], args["ratio"])
            else:
                x = getattr(tf.image, f"stateless_{op}")(x, *args, seed=seed)
            x = tf.clip_by_value(x, 0, 1)
        return tf.image.convert_image_dtype(x, tf.uint8, saturate=True)

    def sample(example):
        seed = tf.random.uniform([2], maxval=tf.int32.max, dtype=tf.int32)
        for i, (cam, kwargs) in enumerate(KWARGS.items()):
            key = f"image_{cam}"
            frames = example["observation"][key]
            example["observation"][key] = tf.stack(
                [one_image(frames[t], seed + i, kwargs) for t in range(WINDOW)]
            )
            example["task"][key] = one_image(example["task"][key], seed + i, kwargs)
        return example

    return sample


def time_host(batch: dict, samples: int, rounds: int) -> list:
    """Seconds per sample of the TensorFlow path: tf.data maps ``samples`` samples on one thread, ``rounds``
    times (the first pass traces the function and is not counted)."""
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    head = {g: {k: v for k, v in d.items() if k != "pad_mask_dict"} for g, d in batch.items()}
    data = tf.data.Dataset.from_tensor_slices(head).take(samples).map(host_augment_fn())
    for _ in data:  # trace and warm up
        pass
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in data:
            pass
        times.append((time.perf_counter() - start) / samples)
    return times


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cores", type=int, default=1, help="CPU cores to pin to (per-core figures)")
    p.add_argument("--platform", default="cpu", help="where the JAX side runs: cpu, tpu or gpu")
    p.add_argument("--host-samples", type=int, default=64, help="samples TensorFlow maps per round")
    p.add_argument(
        "--stored",
        type=int,
        help="every camera's frames stored at this side: the step resizes them first (device only)",
    )
    args = p.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))[: args.cores]
    if args.platform == "cpu":
        os.sched_setaffinity(0, cores)  # before any thread pool starts
        os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
    os.environ["JAX_PLATFORMS"] = args.platform
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import jax

    batch = fake_batch(args.batch, stored=args.stored)
    device = time_device(batch, args.rounds, resize=args.stored is not None)
    per_batch = statistics.median(device)
    where = f"{jax.devices()[0].platform} ({jax.devices()[0].device_kind})"
    images = sum(v.nbytes for g in batch.values() for k, v in g.items() if k != "pad_mask_dict")
    print(
        f"augmentation of window {WINDOW}, primary {SIZES['primary']}x{SIZES['primary']} (crop + colour) + wrist "
        f"{SIZES['wrist']}x{SIZES['wrist']} (colour), goal images; batch {args.batch}; jax {jax.__version__}"
        + (
            f"; frames stored at {args.stored}x{args.stored}, resized in the step"
            if args.stored
            else ""
        )
        + f"; {images / args.batch / 1e3:,.0f} kB of images a sample to the device"
    )
    rows = [("device (jax, " + where + ")", args.batch / per_batch, device)]
    if args.platform == "cpu" and args.stored is None:
        host = time_host(batch, min(args.host_samples, args.batch), args.rounds)
        rows.append(("host (tensorflow tf.data, 1 thread)", 1 / statistics.median(host), host))
    print(f"{'path':<44} {'samples/s':>10} {'per core':>10}   rounds (s per batch or sample)")
    for name, rate, times in rows:
        per_core = rate / len(cores) if "cpu" in name or "host" in name else float("nan")
        print(
            f"{name:<44} {rate:>10.1f} {per_core:>10.1f}   "
            + " ".join(f"{t:.4g}" for t in sorted(times))
        )
    if len(rows) == 2:
        print(f"device / host on {len(cores)} core(s): {rows[0][1] / rows[1][1]:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
