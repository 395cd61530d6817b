"""Text as a model reads it: the model's tokenizer with truncation and token counts
(`tokenization`), a long document cut into chunks of the model's own tokens (`chunking`), a
text tower's input encoder (`input_encoder`), the tokenizer pool's work stopped when its caller
goes (`pool_cancellation`), and OpenAI's cl100k_base token ids decoded back to text
(`openai_tokens`)."""
