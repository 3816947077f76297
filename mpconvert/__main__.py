"""`python -m mpconvert` works like the `mpconvert` console script."""

from mpconvert.cli import main

main()
