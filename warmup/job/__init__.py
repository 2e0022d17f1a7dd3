"""The job: what a training job is (`spec`) and how it is read from the files a TRL user has.

`spec` is the value type; `trl_fields`, `trl_config`, `trl_launch`, `trl_args` and `peft_args` read a
`trl <trainer> --config` YAML and its accelerate launch as TRL and accelerate read them; `model_facts`
reads the model's config.
"""
