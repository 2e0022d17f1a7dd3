"""The pod side: what runs inside a training process.

`activation` (`warmup.activate`), `training_env` (what `warmup exec` sets for the training command),
`callback` (the Trainer callback that counts compiles and reports) and `_sitecustomize` (what a
training process started by `warmup exec` runs at start-up). The trace skip and the kernel layout
serve this side too, but the warm side uses them as well, so they sit beside it (`warmup.trace_skip`,
`warmup.layout`).
"""
