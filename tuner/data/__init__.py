"""Data shipped with the package: the sample trace ``tune run`` replays when given none."""
