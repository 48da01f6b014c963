"""`python -m locojax.sample`: the sample entry point (see `locojax.sample`)."""

from locojax.sample import cli

if __name__ == "__main__":
    cli()
