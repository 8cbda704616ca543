"""The tuner's version, on the ground floor: the simulator stamps it on every run it records,
and nothing it imports may climb back to the package root."""

__version__ = "0.1.0"
