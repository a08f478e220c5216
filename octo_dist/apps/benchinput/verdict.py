"""What a node's GPUs consume, and whether a node's CPU cores feed them: pure arithmetic over written-down numbers.

    need = gpu_need(model_shape("octo-small"), tokens=658)      # samples/s one H200 trains at 40% of its peak
    verdict(62.0, cores=96, gpu_rate=1600.0, gpus=8, model="Octo-Small", basis="at 40% utilisation")
    # -> "feeds 3 of 8 GPUs of Octo-Small at 40% utilisation (5,952 samples/s from 96 cores; 8 GPUs need 12,800)"

A training sample costs ``6 x params x tokens`` FLOPs in the transformer's matrix products (forward and backward)
plus its attention, ``12 x layers x tokens^2 x width`` (QK^T and AV, 2 x 2 x T^2 x width each layer forward, x3
with the backward). Octo-Small's blocks (12 layers of width 384: 12 x 384^2 parameters each, 21.2 M) at window 2
with a 256x256 primary and a 128x128 wrist camera (patches of 16: 256 + 64 tokens a frame, 1 readout token a frame,
16 language tokens): 658 tokens, 108 GFLOP a sample. The stems, heads and embeddings are left out (a few % more).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Optional, Tuple

H200_BF16_DENSE = (
    989e12  # FLOP/s: an H200's peak for dense bf16 matrix products (NVIDIA's data sheet)
)
DEFAULT_UTILISATION = 0.40  # the share of that peak a well-tuned transformer step reaches
DEFAULT_CORES_PER_NODE = 96  # ABCI 3.0 rt_HF: 2 x 48-core Xeon per node of 8 H200
DEFAULT_GPUS_PER_NODE = 8


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """A transformer's shape, as its config says: ``ModelShape("Octo-Small", layers=12, width=384)``."""

    name: str
    layers: int
    width: int
    patch: int = 16  # the image tokenizers' patch side (Octo's SmallStem16)
    readouts: int = 1  # readout tokens per frame (Octo's "action" readout)
    language_tokens: int = 16  # the T5 tokenizer's max_length in Octo's configs

    @property
    def params(self) -> int:
        """The blocks' parameters: 4 width^2 (attention) + 8 width^2 (MLP of 4 x width) per layer."""
        return 12 * self.layers * self.width**2


MODELS = {
    "octo-small": ModelShape("Octo-Small", layers=12, width=384),
    "octo-base": ModelShape("Octo-Base", layers=12, width=768),
}


def model_shape(name: str) -> ModelShape:
    """``"octo-small"`` -> its shape; a ValueError naming the known ones otherwise."""
    try:
        return MODELS[name.lower()]
    except KeyError:
        raise ValueError(f"model {name!r}; expected one of {sorted(MODELS)}") from None


def tokens_per_sample(
    shape: ModelShape, window: int, image_sizes: Mapping[str, Tuple[int, int]]
) -> int:
    """Tokens the transformer sees per training sample: every frame of the window has each camera's patches and
    the readouts; the task adds the language tokens (a goal image is stacked on the frame's channels in Octo, so it
    adds none). ``window=2, {"primary": (256, 256), "wrist": (128, 128)}`` -> 2 x (256 + 64 + 1) + 16 = 658."""
    patches = sum((h // shape.patch) * (w // shape.patch) for h, w in image_sizes.values())
    return window * (patches + shape.readouts) + shape.language_tokens


def flops_per_sample(shape: ModelShape, tokens: int) -> float:
    """Training FLOPs per sample: 6 x params x tokens + attention's 12 x layers x tokens^2 x width."""
    return 6.0 * shape.params * tokens + 12.0 * shape.layers * tokens**2 * shape.width


def gpu_need(
    shape: ModelShape,
    tokens: int,
    utilisation: float = DEFAULT_UTILISATION,
    peak: float = H200_BF16_DENSE,
) -> float:
    """Samples/s one GPU trains at ``utilisation`` of its ``peak``."""
    return peak * utilisation / flops_per_sample(shape, tokens)


def gpus_fed(node_rate: float, gpu_rate: float, gpus: int) -> int:
    """How many of a node's ``gpus`` its input pipelines keep busy: ``5952 / 1600`` -> 3 (of 8)."""
    if gpu_rate <= 0:
        raise ValueError(f"GPU consumption {gpu_rate} samples/s; expected a positive rate")
    return min(gpus, math.floor(node_rate / gpu_rate))


def verdict(
    samples_per_core: float,
    *,
    cores: int,
    gpu_rate: float,
    gpus: int,
    model: str,
    basis: str,
) -> str:
    """The node's verdict line, from the numbers printed beside it: ``62 /s/core x 96 cores`` against ``1,600
    samples/s per GPU`` -> "feeds 3 of 8 GPUs of Octo-Small <basis> (5,952 samples/s from 96 cores; 8 GPUs need
    12,800)"."""
    node_rate = samples_per_core * cores
    fed = gpus_fed(node_rate, gpu_rate, gpus)
    need = gpu_rate * gpus
    margin = f", {node_rate / need:.1f}x what they need" if fed == gpus else ""
    return (
        f"feeds {fed} of {gpus} GPUs of {model} {basis} ({node_rate:,.0f} samples/s from {cores} cores; "
        f"{gpus} GPUs need {need:,.0f}{margin})"
    )


def consumption(
    shape: ModelShape,
    window: int,
    image_sizes: Mapping[str, Tuple[int, int]],
    utilisation: float = DEFAULT_UTILISATION,
    step_rate: Optional[float] = None,
) -> Tuple[float, str, str]:
    """(samples/s per GPU, the verdict's basis "at 40% utilisation", a line saying how it was computed)."""
    tokens = tokens_per_sample(shape, window, image_sizes)
    flops = flops_per_sample(shape, tokens)
    if step_rate is not None:
        return (
            step_rate,
            f"at the measured {step_rate:,.0f} samples/s per GPU",
            f"GPU consumption: {step_rate:,.0f} samples/s per GPU (--step-rate, measured)",
        )
    rate = gpu_need(shape, tokens, utilisation)
    how = (
        f"GPU consumption: {shape.name} ({shape.layers} layers, width {shape.width}, "
        f"{shape.params / 1e6:.1f} M block parameters), {tokens} tokens/sample (window {window}, "
        + ", ".join(f"{n} {h}x{w}" for n, (h, w) in image_sizes.items())
        + f"): {flops / 1e9:.1f} GFLOP/sample; H200 {H200_BF16_DENSE / 1e12:.0f} TFLOP/s bf16 at "
        f"{utilisation:.0%}: {rate:,.0f} samples/s per GPU"
    )
    return rate, f"at {utilisation:.0%} utilisation", how


def converted_rate(
    rest: float,
    decode: float,
    stored: Mapping[str, Tuple[int, int]],
    sizes: Mapping[str, Tuple[int, int]],
) -> Optional[float]:
    """CPU seconds per sample of the device-augmentation pipeline on a copy made by ``convert-frames``, estimated
    from this data's: reading and batching (``rest``) unchanged, decoding (``decode - rest``) scaled by the pixels
    decoded (a JPEG decode's cost follows its pixels). None where no camera is stored at another size than the
    model's (the copy would be this data). ``{"primary": (512, 512)}`` at ``(256, 256)``: decoding x 0.25."""
    cameras = [c for c in sizes if c in stored]
    if all(tuple(stored[c]) == tuple(sizes[c]) for c in cameras):
        return None
    before = sum(stored[c][0] * stored[c][1] for c in cameras)
    after = sum(sizes[c][0] * sizes[c][1] for c in cameras)
    return rest + max(decode - rest, 0.0) * after / before
