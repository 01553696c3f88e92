"""The `splatq` command: `main` (parsing and process wiring, the console script), and the
command groups it adds: `client` (submit/get/wait/...), `dlq`, `info`, `tenant`, `health`
(`<service> --check`). `python -m splatq.services.cli` runs it too."""
