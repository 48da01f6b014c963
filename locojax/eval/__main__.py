"""`python -m locojax.eval`: the eval entry point (see `locojax.eval`)."""

from locojax.eval import cli

if __name__ == "__main__":
    cli()
