"""What a host makes of its prompts each step: episodes (one reply, or turns with tools and
environments). This room starts with the step's PRNG keys (`keys`); the host step, its
schedules and transcripts still live in `locojax.runtime` (issue 61)."""
