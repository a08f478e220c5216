"""The job's runtime: what runs on the job's first node after the rendered script's header and ``module load``.

``supervise`` starts the preflight and the training under the scheduler's launcher, turns every stop signal into
the launcher's stop, ends a launcher that outlives a failed rank, fails a job whose ranks did not all finish, and
writes the chain's status; ``rankguard`` runs under the launcher around each rank. Standard library only, Python
3.9+: it runs with the host's ``python3`` (the venv's python from a checkout), or from the zipapp ``zipapp.build``
writes (``octo-dist job-runtime -o FILE``) when the host has only the image.

    python3 RUNTIME.pyz supervise SETTINGS_JSON      # the rendered script's last line
    python3 RUNTIME.pyz octo-dist-rank JOB_DIR CMD... # under the launcher, on every node (the supervisor adds it)
"""
