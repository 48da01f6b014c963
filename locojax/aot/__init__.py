"""Ahead-of-time compile of the plan's own programs for a TPU slice (`locojax-plan ... aot=true`)."""
