"""The numerics the backends and the engine share, on numpy arrays and the vocabulary only:
a model's inputs (`inputs`: `Encoded`, `ModelInputs`), pooling and the heads built from it
(`pooling`, `heads`), and whether a reduced precision is faithful to float32 (`fidelity`).
They sit below the backends, which run heads inside their graphs and measure precisions."""
