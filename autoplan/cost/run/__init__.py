"""Beyond one step: whole-run hours, checkpoints, failures and goodput."""
