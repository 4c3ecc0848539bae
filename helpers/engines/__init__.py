"""One folder per engine: everything the workbook knows about that engine lives in it.

Each folder holds the engine's rule (what a release does with a draft's ids: ``rule``, and ``source`` for
reading the release's own files), and, where the engine runs here, its live process (``install``,
``engine``, ``bench``), the code that runs inside it (``plugin``), and its exports (``exports``: the
metrics, logs and responses it writes). What every engine shares stays outside: ``rules`` (the Engine value,
the registry of rule objects, the release matrix), ``live`` (the one bench shape, timing, the guard), and
``investigation.exports`` (the one served profile). docs/architecture.md has the picture; adding an engine
is adding a folder (and its name in the registry).
"""
