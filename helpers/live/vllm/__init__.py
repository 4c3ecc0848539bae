"""vLLM's side: the live engine from ``.venv-vllm`` (install, engine, worker), the plugin that runs inside
it, and the investigation's rows measured on it (docs/vllm.md)."""
