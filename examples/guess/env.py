"""Guess-a-number: a multi-turn environment of your own (docs/multiturn.md).

One instance per episode, built from its data row (its `secret` column). Each
reply's last number is a guess; the environment says "higher" or "lower" until the guess is
right (the episode ends) or the turns run out. A wrong guess costs 0.1; the workload's reward
(`gsm8k`: the last reply's number against `answer`) scores the last guess.
"""

import re


class GuessNumber:
    def __init__(self, row: dict):
        self.secret = int(row["secret"])
        self.high = int(row.get("high", 9))

    def reset(self) -> list[dict]:
        return [{"role": "user", "content": f"Guess my number from 1 to {self.high}. "
                                            "Answer with one number."}]

    def step(self, reply: str) -> tuple[list[dict], float | None, bool]:
        numbers = re.findall(r"\d+", reply)
        if not numbers:
            return [{"role": "user", "content": "Answer with one number."}], -0.1, False
        guess = int(numbers[-1])
        if guess == self.secret:
            return [], None, True
        hint = "higher" if guess < self.secret else "lower"
        return [{"role": "user", "content": f"{guess} is wrong: {hint}."}], -0.1, False
