# The example plugin package is tested as its author would, installed: the guide's test
# (docs/writing-plugins.md, tests/integration/test_plugin_guide.py) installs it and runs its tests.
collect_ignore = ["example_plugin"]
