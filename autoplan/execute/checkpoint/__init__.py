"""Checkpoints: save a running plan's state, resume it on the same or another plan (docs/elastic.md).

``state`` puts a trainer's state in one plan-independent form (FQN-keyed, shards as DTensors);
``store`` owns the layout on disk and the checks before a load; ``manager`` saves and loads
during a run and stops on a signal with a final checkpoint; ``replan`` picks a plan for another
device count from a checkpoint.
"""
