"""The long run's environment (benchmarks/long_runs.py): each step sleeps a random time from 0
to twice `LONG_RUN_ENV_MS` (default 10) and raises in `LONG_RUN_ENV_FAIL` of the steps (default
0.05); otherwise it answers "again" and ends the episode on its third step. Draws are seeded by
the episode's prompt, its step count and the process, so failures fall on varying episodes."""

import os
import random
import time
import zlib


class Flaky:
    def __init__(self, row: dict):
        seed = zlib.crc32(f"{row.get('prompt', '')}:{os.getpid()}:{time.time_ns()}".encode())
        self.draw = random.Random(seed)
        self.step_s = float(os.environ.get("LONG_RUN_ENV_MS", "10")) / 1000
        self.fail = float(os.environ.get("LONG_RUN_ENV_FAIL", "0.05"))
        self.steps = 0

    def step(self, reply: str) -> tuple[list[dict], float | None, bool]:
        self.steps += 1
        time.sleep(2 * self.step_s * self.draw.random())
        if self.draw.random() < self.fail:
            raise RuntimeError(f"flaky on step {self.steps}")
        return [{"role": "user", "content": "again"}], 0.0, self.steps >= 3
