"""Memory per device: the formulas, and a plan's stages priced with them."""
