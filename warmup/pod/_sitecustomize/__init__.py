"""The directory `warmup exec` puts first on the training command's PYTHONPATH (see sitecustomize.py;
`warmup.pod.training_env.SITECUSTOMIZE_DIRECTORY` names it). Nothing imports this package.
"""
