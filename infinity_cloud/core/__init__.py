"""The vocabulary every layer speaks, importing nothing else of the package: the spec
(config.py), what a served model does (capability.py), what a model family is (family.py), what a
kind of input is (input_kind.py), the errors, the results, this machine (hardware.py), and the
small tools every layer uses (per_input, progress, install_hint, content_digest)."""
