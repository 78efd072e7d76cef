"""Checkpoints: save a running plan's state, resume it on the same or another plan (docs/elastic.md).

``state`` puts a trainer's state in one plan-independent form (FQN-keyed, shards as DTensors);
``store`` owns the layout on disk and the checks before a load; ``manager`` saves and loads
during a run and stops on a signal with a final checkpoint. A plan for another device count
comes from the planner (autoplan/solve/replan.py), called by autoplan/cli/checkpoints.py and,
for ``--elastic``, passed in to the ranks by autoplan/cli/rank.py.
"""
