"""Rewards of the reverse-the-digits task (examples/reverse/train.jsonl): run on every host."""


def exact(prompts, completions, target, **columns):
    """1 when the completion starts with the reversed digits, else 0."""
    return [float(c.strip().startswith(t)) for c, t in zip(completions, target, strict=True)]


def overlap(prompts, completions, target, **columns):
    """Share of the target's digits in the right place (None: no target to compare with)."""
    return [sum(a == b for a, b in zip(c.strip(), t, strict=False)) / len(t) if t else None
            for c, t in zip(completions, target, strict=True)]
