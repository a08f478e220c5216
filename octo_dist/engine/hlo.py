"""What a compiled train step communicates: its all-reduces, counted and sized from XLA's HLO text.

    text = eng.compiled_text(state, batch)         # jax's .lower(...).compile().as_text()
    hlo.all_reduces(text)                          # [337532]: one all-reduce of 337,532 bytes

On the CPU every all-reduce between processes is a gloo round trip over TCP, so their number matters as much as
their bytes; XLA's GPU pipeline combines them first. Pure text parsing: no jax here.
"""

from __future__ import annotations

import math
import re

# Bytes per element of XLA's primitive types (the ones a train step all-reduces, and a few more).
ELEMENT_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
# An instruction's result, e.g. (CPU) `%all-reduce = f32[84383]{0} all-reduce(f32[84383]{0} %fusion.182), ...`,
# (GPU, async) `%all-reduce-start = (f32[10]{0}, f32[3,4]{1,0}) all-reduce-start(...)`; the `-done` half is not
# counted, so each all-reduce counts once.
_ALL_REDUCE = re.compile(r"=\s*(?P<shape>\([^=]*?\)|\S+)\s+all-reduce(?:-start)?\(")
_ARRAY = re.compile(r"\b(" + "|".join(ELEMENT_BYTES) + r")\[([0-9,]*)\]")


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape, a tuple's summed: ``"(f32[2,3]{1,0}, s32[])"`` -> 28."""
    return sum(
        ELEMENT_BYTES[t] * math.prod(int(d) for d in dims.split(",") if d)
        for t, dims in _ARRAY.findall(shape)
    )


def all_reduces(hlo_text: str) -> list[int]:
    """The bytes of every all-reduce in ``hlo_text``, in program order (an empty list: the step communicates none)."""
    return [shape_bytes(m.group("shape")) for m in _ALL_REDUCE.finditer(hlo_text)]
