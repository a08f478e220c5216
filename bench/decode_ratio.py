#!/usr/bin/env python3
"""Decoding a JPEG at a reduced scale (libjpeg's ``ratio``) against decode + lanczos3: the pixel difference, held
to the resize equivalence bound, and the time of each, on real photographs (:mod:`octo_dist.apps.benchinput.
decodescale`). Prints; asserts nothing.

Each photo is cut (a crop, no resampling) to stored frames that are exact multiples of a model size, as a
camera's would be, and stored as JPEG (quality 95): 512x512 for 256x256 (1/2) and 128x128 (1/4), the same from
472x472 crops (photos under 512 pixels high), 256x256 (the centre square resized with lanczos3) for 128x128 (1/2),
a 472x720 crop for 59x90 (1/8); a photo smaller than a case is left out of it. One core, TensorFlow with one
thread; the time is CPU time, the median of ``--rounds`` interleaved rounds.

usage: bench/decode_ratio.py PHOTO.jpg [PHOTO.jpg ...] [--rounds 5] [--cores 1]
"""

import argparse
import os
import statistics
import sys
import time

# stored (height, width) -> the ratio it is decoded at; the stored frame is cut from the photo's centre
CASES = [
    ((512, 512), 2),
    ((512, 512), 4),
    ((472, 472), 2),
    ((472, 472), 4),
    ((256, 256), 2),
    ((472, 720), 8),
]


def stored_frame(photo, stored):
    """The photo cut to ``stored``, encoded as JPEG; None where the photo is smaller (an enlarged photo would be
    smoother than a camera's frame, and flatter the reduced-scale decode)."""
    import tensorflow as tf

    from octo_dist.apps.finetune import frames

    h, w = photo.shape[:2]
    if h < stored[0] or w < stored[1]:
        return None
    if stored == (
        256,
        256,
    ):  # a small camera frame: the whole centre square, shrunk (a camera's field of view)
        side = min(h, w)
        square = photo[(h - side) // 2 :][:side, (w - side) // 2 :][:, :side]
        photo, h, w = frames.resize_image(square, stored).numpy(), *stored
    top, left = (h - stored[0]) // 2, (w - stored[1]) // 2
    return tf.io.encode_jpeg(
        photo[top : top + stored[0], left : left + stored[1]], quality=95
    ).numpy()


def cpu_ms(fn, rounds):
    out = []
    for _ in range(rounds):
        cpu = time.process_time()
        fn()
        out.append((time.process_time() - cpu) * 1e3)
    return statistics.median(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("photos", nargs="+", help="JPEG photographs")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cores", type=int, default=1)
    args = p.parse_args(argv)
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.cores])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from octo_dist.apps.benchinput import decodescale
    from octo_dist.apps.finetune import frames

    photos = [
        tf.io.decode_jpeg(open(path, "rb").read(), channels=3).numpy() for path in args.photos
    ]
    print(f"{len(photos)} photos: " + ", ".join(f"{x.shape[0]}x{x.shape[1]}" for x in photos))
    print(
        f"{'stored -> model':<18} {'ratio':>5}  {'decode+lanczos3':>15}  {'decode only':>11}  {'decode 1/r':>10}  "
        "|1/r decode - decode+lanczos3| (uint8 levels, over the photos)"
    )
    for stored, ratio in CASES:
        jpegs = [j for j in (stored_frame(x, stored) for x in photos) if j is not None]
        if not jpegs:
            print(f"{stored[0]}x{stored[1]}: no photo that large")
            continue
        size = (-(-stored[0] // ratio), -(-stored[1] // ratio))

        def full():
            for j in jpegs:
                frames.resize_image(tf.io.decode_jpeg(j, channels=3), size)

        def decode():
            for j in jpegs:
                tf.io.decode_jpeg(j, channels=3)

        def scaled():
            for j in jpegs:
                tf.io.decode_jpeg(j, channels=3, ratio=ratio)

        timed = {"full": full, "decode": decode, "scaled": scaled}
        times = {name: [] for name in timed}
        for fn in timed.values():
            fn()  # warm
        for _ in range(args.rounds):
            for name, fn in timed.items():
                times[name].append(cpu_ms(fn, 1) / len(jpegs))
        ms = {name: statistics.median(values) for name, values in times.items()}
        diffs = [decodescale.difference(j, ratio) for j in jpegs]
        case = f"{stored[0]}x{stored[1]} -> {size[0]}x{size[1]}"
        print(
            f"{case:<18} {ratio:>5}  {ms['full']:12.2f} ms  {ms['decode']:8.2f} ms  {ms['scaled']:7.2f} ms  "
            f"{decodescale.words(diffs)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
