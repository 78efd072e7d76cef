"""Pipeline parallelism: the schedule and the weights tied across stages."""
