"""The package version, in a leaf module: stages that record it import this, not the package root."""

__version__ = "0.1.0"  # keep equal to pyproject.toml [project] version
