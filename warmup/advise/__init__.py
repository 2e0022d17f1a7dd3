"""`warmup advise`: the padding that makes the whole job fastest, from the dataset's real lengths.

`advice` (the options compared, `advise()`), `data` (the dataset's lengths), `simulate` (the trainer's
batching replayed), `cost` (compile and step costs).
"""
