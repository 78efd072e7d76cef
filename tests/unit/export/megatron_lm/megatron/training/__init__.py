# Not Megatron-LM's file: its megatron/training/__init__.py imports the training loop (pretrain),
# which the start-up check does not need. See ../../README.md.
