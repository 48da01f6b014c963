"""CO (colocated): every host rolls out, scores and trains; only the train step is global.

    launch.dispatch ──run_here (co.host)──> run_host (co.loop): this host's RL loop over the
        step kit (runtime.steps, runtime.episode, runtime.trainer); statistics and the stop
        flag all-gathered over jax.distributed; the primary host writes the metrics
"""
