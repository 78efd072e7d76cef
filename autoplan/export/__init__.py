"""Plans out to the trainers people already use, and their configs back in (docs/export.md).

``export_plan(plan, to=...)`` writes torchtitan's TOML, Megatron-LM's arguments, DeepSpeed's
JSON or Accelerate's FSDP YAML for a plan; ``import_config(path)`` reads one back into plan
fields that the cost model can price and explain.
"""

from autoplan.export.common import FRAMEWORKS, Exported, ExportError, Imported, ModelFacts

__all__ = ["FRAMEWORKS", "ExportError", "Exported", "Imported", "ModelFacts"]
