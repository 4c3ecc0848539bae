"""What engines and trainers do with a draft's ids, read from their own releases: the engine rule
objects, the conventions, the resolver and SGLang's own source (``rules.sglang``)."""
