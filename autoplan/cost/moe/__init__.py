"""Mixture-of-Experts: expert placement, grouped GEMMs and all-to-alls."""
