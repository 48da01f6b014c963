"""Start-up of a run: join the job, agree on one plan and one directory, start the plan.

    join.py      join the multi-process job (Slurm, Open MPI, TPU pod, Kubernetes, by hand)
                 before any JAX call (`join`); one process when there is none
    agree.py     every host's configuration, plan and run directory are one (`agreed_plan`,
                 `same_run_dir`); a difference is one line on every host
    fatal.py     jax.distributed's fatal C++ reports (a host missing, a host dead) as one line
    dispatch.py  `launch(plan, run_dir, formation)`: this host's share, N emulated hosts
                 (`mesh=cpu mesh.hosts=N`: the same command N times on this machine) or DA
    host.py      one host's share of the plan (`run_here`)
    local.py     the local launcher: N copies of a command joined by `jax.distributed`
                 (`python -m locojax.launch.local --hosts 2 -- <command>`)
"""
