"""``octo-dist validate``: the first thing to run on a GPU node (environment, scaling on the node, NCCL across
nodes)."""
