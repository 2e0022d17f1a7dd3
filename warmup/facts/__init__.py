"""Data facts read from the dataset itself, tokenized as the job's TRL trainer tokenizes it.

`reading.dataset_facts(job, dataset)` reads a local dataset (a JSON / JSONL / Parquet / CSV / Arrow file, a
`datasets.save_to_disk` directory, a directory of data files, or the job's own `dataset_name` / `datasets`
when they resolve locally: nothing is downloaded), runs every example through the preprocessing of the job's
trainer in TRL 1.16 with the model's own tokenizer and chat template, and returns the facts the planner needs
(`DataFacts`) together with the token length of every row in dataset order, for whoever needs more than the
summary. `tests/integration/planner/test_dataset_facts.py` holds the lengths to the ones TRL's trainers
produce on the same data.

The modules, in the order a read goes through them:

- `opening`: the dataset's splits, opened as `trl` opens them;
- `recipe`: what the read needs of the trainer config (`Recipe`);
- `tokenizing`: the tokenizer calls TRL makes, batched;
- `rows`: what a row and a prompt are for each trainer family, after TRL's `_prepare_dataset`;
- `packing`: the rows SFT's packing builds;
- `summary`: `SplitFacts`, `DatasetFacts`, the planner's `DataFacts` and what the CLI prints;
- `reading`: `dataset_facts`, the entry point: splits read in batches, in threads.

TRL, transformers and datasets are imported only when facts are computed: the package stays out of the way
of what a training pod imports.
"""
