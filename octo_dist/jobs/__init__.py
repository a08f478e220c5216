"""Job scripts for PBS Professional (ABCI 3.0), Grid Engine and SLURM: ``octo-dist launch {pbs,sge,slurm}``.

``spec.LaunchOptions`` holds the choices (the parser is generated from its fields); ``spec.build(options)``
validates them into a ``JobSpec`` (or refuses with found/expected/fix); ``render.render(spec)`` turns it into a
short script: the header of its scheduler (``schedulers/``, one module each), ``module load``, and one hand-over to
the job runtime (``supervisor/``, standard library Python), which runs the job on its first node. ``defaults`` reads
the users' and projects' defaults files; ``submit`` hands the script to the scheduler (``--submit``, ``--chain``);
``cli`` is the thin subcommand; ``examples`` renders the ready-made scripts in ``scripts/jobs/``.
"""
