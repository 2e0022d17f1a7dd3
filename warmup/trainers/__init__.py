"""One record per TRL trainer family: everything the product knows of a trainer kind, in one module per kind.

record.py: `TrainerFamily`, the record's fields; registry.py: `FAMILIES` and `family(kind)`, the one table of
kinds; sft.py, dpo.py, kto.py, reward.py, grpo.py, rloo.py, distillation.py: one record each, as TRL keeps one
config and one trainer module per method. The records are plain data, importable on a pod without torch or TRL:
the planner and the rehearsal's row builder are named by `module:function` and imported when first used.
"""
