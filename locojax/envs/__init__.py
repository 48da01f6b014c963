"""Multi-turn episodes: environments, the tools a model may call, and how turns become text."""
