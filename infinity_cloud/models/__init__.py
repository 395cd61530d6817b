"""One served model, from its files to its towers: where the files come from
(`model_source`), which backend runs each graph and whether a reduced precision is faithful
to float32 (`backend_choice`, `fidelity`), and the model with its tokenizer, towers and batch
workers (`served_model`)."""
