"""The EPP's tools, a distribution of their own (``inference-epp-tools``, ``tools/``): the
model-server simulator (``sim``, ``epp sim``), the local stack (``stack``, ``epp stack``) and
the benchmarks and failure scenarios (``bench``, ``epp bench``). The service (``epp``) never
imports them; its command line loads a tool's subcommand when asked for it."""
