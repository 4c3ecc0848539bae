"""What engines and trainers do with a draft's ids, read from their own releases: the engine rule
objects, the conventions, the resolver and SGLang's own source (``engines.sglang``).

The package itself imports nothing: ``conventions.rules_of`` loads ``engines`` by name the first time an
``Engine`` asks for its rules, and ``engines`` registers every family's rule object there, so an ``Engine``
value anywhere below reaches its rules without importing upward."""
