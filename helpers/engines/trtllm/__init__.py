"""TensorRT-LLM: ``rule`` holds its recorded rule (its own sources are not fetched here, and it does not
run here)."""
