"""Guess-a-number as a verifiers 0.4 environment (a taskset module), for `workload.env=verifiers:`.

Written against verifiers' own API only (`import verifiers.v1 as vf`), in the shape of the
package's TextArena environment: a `Taskset` whose `load()` yields the tasks (an in-memory
list: no download), a `Task` whose `@vf.reward` scores the finished trace, a `@vf.stop` that
ends an exchange, and an `Env` whose `run()` plays the user between the model's turns
(`interaction.turn(message)`): "higher" or "lower" until the guess is right.

    locojax workload=hub workload.env=verifiers:examples/hubs/vf_guess.py   (docs/multiturn.md)
"""

import re

import verifiers.v1 as vf


class GuessData(vf.TaskData):
    answer: str
    """The secret number."""


class GuessTask(vf.Task[GuessData]):
    @vf.reward(weight=1.0)
    async def solved(self, trace: vf.Trace) -> float:
        """1 when the last reply's last number is the secret."""
        numbers = re.findall(r"\d+", trace.last_reply)
        return float(bool(numbers) and numbers[-1] == self.data.answer)

    @vf.stop
    def gave_up(self, trace: vf.Trace) -> bool:
        """An empty reply ends the exchange."""
        return trace.num_turns > 0 and not trace.last_reply


class GuessConfig(vf.TasksetConfig):
    high: int = 9
    """The secret is in [1, high]."""
    num_tasks: int = 32


class GuessTaskset(vf.Taskset[GuessTask, GuessConfig]):
    def load(self) -> list[GuessTask]:
        high = self.config.high
        return [GuessTask(GuessData(prompt=f"Guess my number from 1 to {high}.",
                                    answer=str(1 + (7 * i) % high)), self.config.task)
                for i in range(self.config.num_tasks)]


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                numbers = re.findall(r"\d+", segment.last_reply)
                if numbers and numbers[-1] == task.data.answer:
                    break
                hint = ("a number" if not numbers else
                        "higher" if int(numbers[-1]) < int(task.data.answer) else "lower")
                segment = await interaction.turn(f"No: {hint}.")
        interaction.trace.record_metric("guesses", float(interaction.trace.num_turns))


__all__ = ["GuessEnv", "GuessTaskset"]
