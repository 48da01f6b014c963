"""The benchmark's environment: every step costs a known host time and the episode never ends
on its own, so each one runs exactly `workload.max_turns` turns (benchmarks/multiturn.py).

`MULTITURN_ENV_STEP_MS` (default 20) sets the milliseconds of CPU work per step: a busy loop,
as parsing, a tool or a simulator would spend, not a sleep that costs no core;
`MULTITURN_ENV_SLEEP=1` makes it a sleep instead: a step waiting on something else (a sandbox,
a remote tool, an API). `MULTITURN_ENV_JITTER=1` draws each step's time uniformly from 0 to
twice the set time (the same mean), seeded by the episode's prompt and its step count.
"""

import os
import random
import time
import zlib


class Busy:
    def __init__(self, row: dict):
        self.step_s = float(os.environ.get("MULTITURN_ENV_STEP_MS", "20")) / 1000
        self.sleep = os.environ.get("MULTITURN_ENV_SLEEP") == "1"
        self.jitter = os.environ.get("MULTITURN_ENV_JITTER") == "1"
        self.seed, self.steps = zlib.crc32(str(row.get("prompt", "")).encode()), 0

    def step(self, reply: str) -> tuple[list[dict], float | None, bool]:
        self.steps += 1
        seconds = self.step_s
        if self.jitter:
            seconds *= 2 * random.Random(self.seed * 1009 + self.steps).random()
        if self.sleep:
            time.sleep(seconds)
        else:
            end = time.process_time() + seconds
            while time.process_time() < end:
                pass
        return [{"role": "user", "content": "go on"}], 0.0, False
