"""Run twice by tests/test_engine.py with one cache directory: prints whether JAX hit its persistent cache.

usage: python compile_cache.py DIR   (XLA_FLAGS must hold --xla_cpu_use_xla_runtime=true: JAX caches on the CPU
only then, and that runtime cannot execute every op, so this program jits an elementwise function)
"""

import io
import json
import logging
import sys

from octo_dist.runtime import compile_cache

captured = io.StringIO()
handler = logging.StreamHandler(captured)
logging.getLogger("jax._src.compiler").addHandler(handler)
logging.getLogger("jax._src.compiler").setLevel(logging.DEBUG)

compile_cache.enable(sys.argv[1], min_compile_secs=0)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

value = float(jax.jit(lambda x: jnp.sin(x) * 2 + 1)(jnp.arange(8.0)).sum())
jit_hit = "Persistent compilation cache hit" in captured.getvalue()
# Compiled ahead from shapes, as the engine compiles the train step beside start-up's other work.
before = len(captured.getvalue())
lowered = jax.jit(lambda x: jnp.cos(x) * 3 - 1).lower(jax.ShapeDtypeStruct((8,), jnp.float32))
ahead = lowered.compile()
ahead_hit = "Persistent compilation cache hit" in captured.getvalue()[before:]
value += float(ahead(jnp.arange(8.0)).sum())
print(
    json.dumps(
        {
            "jax": jax.__version__,
            "value": value,
            "hit": jit_hit,
            "ahead_hit": ahead_hit,
        }
    )
)
