"""llama.cpp, the engine: its server built from the pinned release (``build``)."""
