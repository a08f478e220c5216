"""Job scripts for ABCI 3.0 (PBS), ABCI 2.0 (SGE) and SLURM: ``octo-dist launch {pbs,sge,slurm}``.

``spec.build(...)`` validates the choices into a ``JobSpec`` (or refuses with found/expected/fix);
``render.render(spec)`` turns it into a script from the templates here (``*.tmpl``); ``cli`` is the thin
subcommand; ``examples`` renders the ready-made scripts in ``scripts/jobs/``.
"""
