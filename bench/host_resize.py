"""CPU time of the host's resize per image: TensorFlow's kernel (``frames.resize_image``, the fork's) against the two
matrix products with its weights (``frames.resize_products``) and the host's choice (``frames.resize_host``).

    PYTHONPATH=. .venv/bin/python bench/host_resize.py [--rounds 5] [--images 200]

Pinned to one core; each case decodes a camera-like JPEG in a tf.data map (so the image's size is known only when
it runs, as in training) and resizes it; the decode alone is timed too and taken off. Median of ``--rounds``
interleaved rounds (min-max), milliseconds of CPU time (all threads) per image, and the products' pixels against
the kernel's (the resize's bound: 1 level on at most ``frames.RESIZE_SHARE`` of the values). Timings are printed,
never checked.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

CASES = [
    ((64, 64), (256, 256)),
    ((64, 64), (128, 128)),
    ((256, 256), (128, 128)),
    ((480, 640), (256, 256)),
]


def _per_image(dataset, images: int) -> float:
    it = iter(dataset)
    next(it)  # traced, buffers filled
    start = time.process_time()
    for _ in range(images):
        next(it)
    return (time.process_time() - start) / images


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--images", type=int, default=200)
    args = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:1])
    import numpy as np
    import tensorflow as tf

    from octo_dist.apps.finetune import frames

    def decode(e):
        return tf.io.decode_image(e, expand_animations=False, dtype=tf.uint8)

    ways = {
        "decode": lambda e, size: decode(e),
        "kernel": lambda e, size: frames.resize_image(decode(e), size),
        "products": lambda e, size: frames.resize_products(decode(e), size),
        "host": lambda e, size: frames.resize_host(decode(e), size),
    }
    rng = np.random.default_rng(0)
    print("stored -> model   kernel (ms)   products (ms)   host (ms)   products vs kernel (levels)")
    for stored, size in CASES:
        ramp = np.linspace(0, 200, stored[1], dtype=np.float32)[None, :, None]
        image = np.clip(ramp + rng.normal(0, 30, (*stored, 3)), 0, 255).astype(np.uint8)
        encoded = tf.io.encode_jpeg(image, quality=95)
        pipelines = {
            name: tf.data.Dataset.from_tensors(encoded)
            .repeat()
            .map(lambda e, f=f: f(e, size), num_parallel_calls=tf.data.AUTOTUNE)
            .prefetch(2)
            for name, f in ways.items()
        }
        times = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, dataset in pipelines.items():
                times[name].append(_per_image(dataset, args.images))
        base = statistics.median(times["decode"])
        cells = []
        for name in ("kernel", "products", "host"):
            values = [(t - base) * 1e3 for t in times[name]]
            cells.append(f"{statistics.median(values):5.2f} ({min(values):.2f}-{max(values):.2f})")
        decoded = decode(encoded)
        diff = np.abs(
            frames.resize_products(decoded, size).numpy().astype(int)
            - frames.resize_image(decoded, size).numpy().astype(int)
        )
        print(
            f"{stored[0]}x{stored[1]} -> {size[0]}x{size[1]}  "
            + "  ".join(cells)
            + f"  max {diff.max()}, {(diff > 0).mean():.4%} of values"
        )


if __name__ == "__main__":
    main()
