"""xumd: the workspace lifecycle daemon."""

__version__ = "0.1.0"
