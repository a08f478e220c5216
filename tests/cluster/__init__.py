"""A cluster on one machine for tests: namespaced nodes, an ssh agent, scheduler environments, real Slurm,
singularity."""
