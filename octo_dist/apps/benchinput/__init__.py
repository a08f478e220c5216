"""The input benchmark (``octo-dist bench-input``): the fine-tune's input pipeline, ours and the fork's, in samples/s
per CPU core, and whether a node's cores feed its GPUs (:mod:`.cli`, :mod:`.measure`, :mod:`.reader`,
:mod:`.verdict`)."""
