"""The live engines behind one shape (``live.bench``): vLLM and SGLang in their own venvs and processes,
paired timing, the engine guard, and every engine stopped on every exit path."""
