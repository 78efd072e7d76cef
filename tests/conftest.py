"""Puts tests/ on the import path, so every tier imports the one fixtures module, ``synthetic``."""
