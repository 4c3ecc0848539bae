"""vLLM's side, on the plan of ``rules.sglang``: ``rule`` holds what every release read does with a draft's
ids (recorded per release from its wheel), ``source`` re-reads a release's own files to check it."""
