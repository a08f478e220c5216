"""The fork's image augmentation kwargs (its scripts/configs/finetune_config.py; octo-dist's packaged
finetune_config.py keeps them, test_augment checks): the workspace camera's crop and colour changes, the wrist
camera's colour changes without the crop. Pure data, for the tests of both augmenting sides (host and device)."""

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
