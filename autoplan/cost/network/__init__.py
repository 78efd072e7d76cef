"""Where ranks sit and what a collective costs on their links."""
