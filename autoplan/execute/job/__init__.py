"""Running one plan as a job, apart from the appliers that build it (autoplan/execute/).

``runner`` is each rank's entry point (started by autoplan/jobs/launcher.py or torchrun): it
builds the model, calls ``autoplan.execute.parallelize``, trains, times and writes the run
folder; ``verify`` compares a step with the single-process reference; ``audit`` measures what
a step really communicated, computed and held. The appliers (mesh, tensor parallelism, data
parallelism and ZeRO, recomputation, pipeline, precision, tied weights, trainer, ``api``) never
import this package.
"""
