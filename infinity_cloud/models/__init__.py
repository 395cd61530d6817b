"""One served model, from its files to its towers: where the files come from
(`model_source`), which backend runs each graph, at a precision measured faithful to float32
(`backend_choice`, with `numerics.fidelity`), and the model with its tokenizer, towers and batch
workers (`served_model`)."""
