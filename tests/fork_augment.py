"""The fork's image augmentation kwargs (its scripts/configs/finetune_config.py; octo-dist's packaged
finetune_config.py keeps them, test_augment checks): the workspace camera's crop and colour changes, the wrist
camera's colour changes without the crop; and the inputs of the resize tests (:data:`RESIZES`, :func:`textured`).
For the tests of both augmenting and resizing sides (host and device)."""

import numpy as np

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
WRIST = {k: v for k, v in PRIMARY.items() if k != "random_resized_crop"}
WRIST["augment_order"] = PRIMARY["augment_order"][1:]
KWARGS = {"primary": PRIMARY, "wrist": WRIST}

# Stored -> model sizes: the fork's debug data resized up, 256x256 frames for a 128x128 wrist, a camera's native 4:3
# shrunk and squeezed, odd sizes both ways. Measured over these (noise and blocky textures, 4 seeds): 1 level on at
# most 0.049% of the pixels, never 2 (float32 sums in another order tip a value that rounds at .5).
RESIZES = [
    ((64, 64), (256, 256)),
    ((256, 256), (128, 128)),
    ((480, 640), (256, 256)),
    ((200, 180), (256, 256)),
    ((512, 512), (256, 256)),
]


def textured(shape, seed) -> np.ndarray:
    """uint8 blocks of 8x8 plus camera-like noise: edges where lanczos rings, flat areas where it does not."""
    rng = np.random.default_rng(seed)
    h, w, c = shape
    blocks = rng.integers(0, 256, (h // 8 + 1, w // 8 + 1, c)).astype(np.float32)
    img = np.kron(blocks, np.ones((8, 8, 1)))[:h, :w] + rng.normal(0, 20, shape)
    return np.clip(img, 0, 255).astype(np.uint8)
