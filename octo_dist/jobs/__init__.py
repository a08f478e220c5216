"""Job scripts for PBS Professional (ABCI 3.0), Grid Engine and SLURM: ``octo-dist launch {pbs,sge,slurm}``.

The path of a job's settings, each step in one module:

- ``options.LaunchOptions``: the choices, one field per flag (the parser, the defaults files' keys and
  ``--show-defaults`` are generated from it; each scheduler adds its own options, ``schedulers/``);
- ``spec.build(options)``: decided into one ``Job(header, settings: JobSettings)`` and checked once, by the
  settings' own checks in the words of the flags (or refused with found/expected/fix); ``allocation``,
  ``walltime``, ``training`` and ``flagchecks`` are its parts, ``jobwarnings`` what it only warns about;
- ``render.render(job)``: a short script, the scheduler's header, ``module load``, and one hand-over to the job
  runtime carrying ``job.settings`` as JSON (typed, with a schema version);
- ``supervisor/``: the job runtime (standard library Python) reads the settings back through the same
  ``settings`` module and runs the job on its first node.

``commands`` maps the settings to each training program's flags (``Command.flags``); ``defaults`` reads the users'
and projects' defaults files; ``submit`` hands the script to the scheduler (``--submit``, ``--chain``); ``cli`` is
the thin subcommand; ``examples`` renders the ready-made scripts in ``scripts/jobs/``. A scheduler is one module in
``schedulers/`` plus one ``register`` line.
"""
