"""Rewards of the reverse-the-digits task (examples/reverse/train.jsonl): run on every host."""


def exact(prompts, completions, target, **columns):
    """1 when the completion starts with the reversed digits, else 0."""
    return [float(c.strip().startswith(t)) for c, t in zip(completions, target)]


def overlap(prompts, completions, target, **columns):
    """Share of the target's digits in the right place."""
    return [sum(a == b for a, b in zip(c.strip(), t)) / len(t)
            for c, t in zip(completions, target)]
