"""`python -m simulator.cli`: the same entry point as the `servesim` console script."""

from . import main

if __name__ == "__main__":
    main()
