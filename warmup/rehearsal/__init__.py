"""Rehearsal: warm signatures by running the user's own TRL trainer on synthetic data.

`runner` (what a worker calls: `rehearse`, `rehearse_spec`), `zygote` and `child` (the processes a rehearsal
runs in), `drivers` (the trainers built and driven), `units` (which signatures one run produces), `data`
(the synthetic batches), `topology` and `cpu_sharding` (jobs of several processes), `local` (`warmup warm`).
"""
