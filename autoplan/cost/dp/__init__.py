"""Data parallelism: gradient sync, ZeRO traffic and gradient compression."""
