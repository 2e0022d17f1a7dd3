"""Compile backends: where each keeps its cache, what a process needs to hit it, what its artifacts are.

`registry.get_backend(name, device)` picks one; `base.Backend` is the protocol, `inductor` and `neuron` the
two. Importing this package imports neither torch nor torch-neuronx.
"""
