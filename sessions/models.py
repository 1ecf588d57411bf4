# No models yet.
