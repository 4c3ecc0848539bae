"""What engines and trainers do with a draft's ids, read from their own releases: the engine rule
objects, the conventions, the resolver and SGLang's own source (``rules.sglang``).

Loading the package registers every family's rule object with ``conventions`` (``engines`` does it), so an
``Engine`` value anywhere below reaches its rules without importing upward."""
from . import engines  # noqa: F401
