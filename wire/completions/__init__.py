"""The plain-text routes beside the chat ones: OpenAI's legacy /v1/completions (a raw
prompt on the chat core, no chat template), /v1/embeddings, and llama.cpp's /tokenize and
/detokenize."""
