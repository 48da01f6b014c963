"""Hydra glue: the one room (with the entry points) that touches Hydra and OmegaConf.

    compose.py  registers each entry point's schema, composes `conf/`, builds the frozen
                typed `compiler.config` tree (`to_config`, `compose_config`, `CONF_DIR`)
    resolve.py  `mesh=auto`: the detected topology and the matching hardware entry
    detect.py   what devices and processes this run sees (`detect_topology`)
"""
