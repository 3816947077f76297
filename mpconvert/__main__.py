"""`python -m mpconvert` works like the `mpconvert` console script."""

from .cli import main

main()
