"""Put first on PYTHONPATH by tests that run a command which sets XLA_FLAGS itself (``make smoke``: octo-dist smoke
--check-equivalence gives its reference run and its ranks XLA_FLAGS of their own, dropping the caller's): every
Python process of that command, whatever it was given, appends OCTO_DIST_TEST_XLA_FLAGS to its XLA_FLAGS before
JAX reads them, e.g. XLA_FLAGS="--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0".

Python imports the first ``sitecustomize`` on sys.path at start-up (the venv has none of its own)."""

import os

_extra = os.environ.get("OCTO_DIST_TEST_XLA_FLAGS", "")
if _extra and _extra not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_extra}".strip()
