"""Tensor and sequence parallelism inside a block: splits, resharding, memory, overlap."""
