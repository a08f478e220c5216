"""The train step functions a run can ask for, and which one "auto" means: one list for every command line.

Standard library only: ``octo-dist finetune`` and ``smoke`` declare their ``--step-fn`` choices from here when
``octo-dist launch`` checks a command line on a login node, where JAX is not installed.
"""

from __future__ import annotations

from typing import Mapping

STEP_FNS = ("auto", "jit", "shard_map")
# What step_fn="auto" runs on each platform (resolve_step_fn); any platform not named here gets "jit".
AUTO_STEP_FNS = {"cpu": "shard_map"}


def resolve_step_fn(step_fn: str, platform: str, devices: int) -> str:
    """The train step to build: ``step_fn`` itself, or for ``"auto"`` the one that runs best on ``platform``.

    ``"auto"`` on ``"cpu"`` -> ``"shard_map"``: the ranks of a CPU job talk through gloo, where every all-reduce is
    a TCP round trip, and XLA's CPU pipeline does not combine all-reduces: the compiled ``jit`` step holds one per
    parameter leaf (46 for the tiny policy, hundreds for Octo), the ``shard_map`` step one flat vector.
    ``"auto"`` elsewhere (``"gpu"``, ``"tpu"``) -> ``"jit"``: XLA's GPU pipeline combines the per-leaf all-reduces
    into buckets for NCCL (``--xla_gpu_all_reduce_combine_threshold_bytes``), and the loss stays a mean over the
    global batch.

    ``devices``: the mesh's device count over every process. With one there is nothing to all-reduce, and
    ``"auto"`` is ``"jit"`` everywhere: the ``shard_map`` step still packs every gradient into its flat vector and
    back, which cost a fine-tune of a tiny Octo on one CPU device 14-20 ms of a 136-143 ms step (122-124 ms
    with ``jit``, alternating runs of the fork bench's config).

    >>> resolve_step_fn("auto", "cpu", 2), resolve_step_fn("auto", "gpu", 8), resolve_step_fn("jit", "cpu", 2)
    ('shard_map', 'jit', 'jit')
    >>> resolve_step_fn("auto", "cpu", 1), resolve_step_fn("shard_map", "cpu", 1)
    ('jit', 'shard_map')
    """
    if step_fn not in STEP_FNS:
        raise ValueError(f"step_fn {step_fn!r}; expected one of {STEP_FNS}")
    if step_fn == "auto" and devices == 1:
        return "jit"
    return AUTO_STEP_FNS.get(platform, "jit") if step_fn == "auto" else step_fn


# --- where the images of a batch are augmented ----------------------------------------------------------------------

# config.augment_on: "device" augments the batch's images on the accelerator, ahead of the train step
# (octo_dist/engine/augment.py); "host" leaves them to the fork's tf.data pipeline (dlimp's augment_image, per frame
# on the CPU); "auto" (the default) is "device" on GPUs and TPUs and "host" where JAX's device is the CPU.
AUGMENT_ON = ("auto", "device", "host")
DEFAULT_AUGMENT_ON = "auto"
PLACED = ("device", "host")  # where augmentation runs, once "auto" is resolved for a platform


def resolve_augment_on(augment_on: str, platform: str) -> str:
    """Where the images are augmented on ``platform`` (``jax.devices()[0].platform``): ``"auto"`` -> ``"device"``
    on an accelerator. On the CPU the device is the host's own cores, so augmenting there frees nothing for the
    step and runs JAX's ops, which on a CPU are no faster than TensorFlow's (bench/augment.py: 0.6-1.6x by batch
    size), on the same cores as the step: ``"host"``, the fork's placement. An explicit choice is kept.

    >>> resolve_augment_on("auto", "gpu"), resolve_augment_on("auto", "cpu"), resolve_augment_on("device", "cpu")
    ('device', 'host', 'device')
    """
    if augment_on not in AUGMENT_ON:
        raise ValueError(f"augment_on {augment_on!r}; expected one of {AUGMENT_ON}")
    if augment_on != "auto":
        return augment_on
    return "host" if platform == "cpu" else "device"


# The ops of dlimp's augment_image the step implements, with the arguments each takes, positionally or by name:
# {"random_brightness": [0.1]} or {"random_resized_crop": {"scale": [0.8, 1.0], "ratio": [0.9, 1.1]}}.
DEVICE_OPS = {
    "random_resized_crop": ("scale", "ratio"),
    "random_brightness": ("max_delta",),
    "random_contrast": ("lower", "upper"),
    "random_saturation": ("lower", "upper"),
    "random_hue": ("max_delta",),
}


def op_arguments(op: str, value) -> dict:
    """One op's arguments by name, as dlimp passes them (a mapping by name, a sequence positionally).

    >>> op_arguments("random_contrast", [0.9, 1.1]), op_arguments("random_hue", {"max_delta": 0.05})
    ({'lower': 0.9, 'upper': 1.1}, {'max_delta': 0.05})
    """
    names = DEVICE_OPS[op]
    given = dict(value) if hasattr(value, "items") else dict(zip(names, value))
    if sorted(given) != sorted(names) or (not hasattr(value, "items") and len(value) != len(names)):
        raise ValueError(f"{op}: {value!r}; expected {', '.join(names)}, e.g. {_EXAMPLES[op]}")
    return given


_EXAMPLES = {
    "random_resized_crop": '{"scale": [0.8, 1.0], "ratio": [0.9, 1.1]}',
    "random_brightness": "[0.1]",
    "random_contrast": "[0.9, 1.1]",
    "random_saturation": "[0.9, 1.1]",
    "random_hue": "[0.05]",
}


def _pair_problem(op: str, pair, low: float, high: float) -> str:
    if len(pair) != 2:
        return f"{op} {list(pair)}; expected [low, high]"
    lo, hi = (float(x) for x in pair)
    if not (low <= lo <= hi <= high):
        return f"{op} range {[lo, hi]}; expected {low} <= low <= high <= {high}"
    return ""


def _op_problem(op: str, args: Mapping) -> str:
    """TensorFlow's own argument checks for the op (what tf.image refuses, refused up front)."""
    if op == "random_resized_crop":
        return _pair_problem(op + " scale", args["scale"], 0.0, float("inf")) or _pair_problem(
            op + " ratio", args["ratio"], 1e-6, float("inf")
        )
    if op in ("random_contrast", "random_saturation"):
        lo, hi = float(args["lower"]), float(args["upper"])
        return "" if 0 <= lo < hi else f"{op} [{lo}, {hi}]; expected 0 <= lower < upper"
    high = 0.5 if op == "random_hue" else float("inf")
    delta = float(args["max_delta"])
    return (
        "" if 0 <= delta <= high else f"{op} max_delta {delta}; expected 0 <= max_delta <= {high}"
    )


def augment_problems(image_augment_kwargs: Mapping) -> list:
    """What keeps the train step from augmenting as ``image_augment_kwargs`` asks (``[]``: nothing).

    ``image_augment_kwargs`` is Octo's ``frame_transform_kwargs.image_augment_kwargs``: one dict for every camera
    (it has ``augment_order``) or one per camera name (``{"primary": {...}, "wrist": {...}}``).

    >>> augment_problems({"augment_order": ["random_hue"], "random_hue": [0.7]})
    ['random_hue max_delta 0.7; expected 0 <= max_delta <= 0.5']
    """
    per_camera = (
        {"": image_augment_kwargs}
        if "augment_order" in image_augment_kwargs
        else dict(image_augment_kwargs)
    )
    found = []
    for camera, kwargs in per_camera.items():
        where = f" (camera {camera})" if camera else ""
        if not hasattr(kwargs, "items") or "augment_order" not in kwargs:
            found.append(
                f"image_augment_kwargs{where}: {kwargs!r}; expected a dict with augment_order"
            )
            continue
        for op in kwargs["augment_order"]:
            if op not in DEVICE_OPS:
                found.append(
                    f"{op} (in augment_order{where}): not an op the train step implements; expected one of "
                    + ", ".join(DEVICE_OPS)
                )
                continue
            if op not in kwargs:
                found.append(f"{op}{where}: no arguments; expected {op}={_EXAMPLES[op]}")
                continue
            try:
                problem = _op_problem(op, op_arguments(op, kwargs[op]))
            except (TypeError, ValueError) as e:
                problem = str(e)
            if problem:
                found.append(problem + where)
    return found
