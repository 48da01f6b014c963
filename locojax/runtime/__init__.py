"""Coordination layer: the RL loop, its observability and checkpoint utilities."""
