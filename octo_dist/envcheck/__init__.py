"""`octo-dist check-env`: compare an environment with env/stack.toml, fast, with exact remedies.

Fast checks read only distribution metadata (importlib.metadata), files and, for cuDNN, ctypes:
no `import jax`, so they run in well under a second, before any GPU time is spent.
"""
