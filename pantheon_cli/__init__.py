"""The `pantheon` command a user runs: `pantheon serve MODEL.gguf`, `pantheon cluster`,
`pantheon operator`, `pantheon version` (cli.py builds the parser; serve.py runs the
server). Above every other package: it only sets the environment the settings read, then
starts Django and Daphne as `daphne pantheon_site.asgi:application` would."""
