"""Starts a compiled plan: here, as N local host processes, or as DA Ray actors.

    dispatch.py  `launch(plan, run_dir)`: writes plan.json, then CO on this process, CO on N
                 emulated hosts (`mesh=cpu` with `mesh.hosts` > 1) or DA (`run_da`)
    host.py      one host's share of the plan (`run_here`); `python -m locojax.launch.host
                 <run dir>` is the process the local launcher starts for each emulated host
    local.py     the local launcher: N copies of a command joined by `jax.distributed`
                 (`python -m locojax.launch.local --hosts 2 -- <command>`)
"""
