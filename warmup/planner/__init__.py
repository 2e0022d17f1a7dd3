"""Spec -> plan: the exact set of signatures a TRL job will hit, plus warnings for what cannot be listed.

`planning` (`plan`, `plan_spec`: the job's args resolved, its family's planner run, the warnings), one module
per trainer family (`sft`, `preference`, `online`, `distillation`), `common` (the builder they share),
`estimate` (compile seconds), `sharding` and `topology` (jobs of several processes).
"""
