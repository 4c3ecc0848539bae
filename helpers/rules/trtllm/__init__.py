"""TensorRT-LLM's side, on the plan of ``rules.sglang``: ``rule`` holds its recorded rule (its own
sources are not fetched here)."""
