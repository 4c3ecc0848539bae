"""SGLang itself, from ``.venv-sglang``: install, the engine and its HTTP server, its live rows,
and the CPU accommodations (``cpu``) it runs with on a host without a GPU (docs/sglang-cpu.md)."""
