"""Running N processes as one job: spawning, free ports, stop signals, parents that die.

The job layer knows nothing of models or plans: ``launcher.launch`` starts ``python -m MODULE``
once per rank with torchrun's environment and watches them (the executor's ranks,
``autoplan/cli/rank.py``); ``lifeline`` makes every rank die with its launcher; and
``launcher.free_port`` is the one rendezvous port picker (the profiler's measuring processes use
it too). It sits before every stage that spawns processes, so each can use it.
"""
