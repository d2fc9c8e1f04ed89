"""The package's version (also in pyproject.toml), in a leaf module that any layer may import."""

__version__ = "0.1.0"
