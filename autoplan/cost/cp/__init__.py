"""Context parallelism: what it sends, its time beside attention, and the ranks that share weights."""
