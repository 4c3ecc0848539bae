"""The models: the EAGLE-3 draft and its checkpoint formats, the reference speculative engine, the
residual-stream capture, and the embedded target pair and its build."""
