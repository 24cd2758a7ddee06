# The example plugin package is tested as its author would, installed: the README guide's test
# (tests/integration/test_plugin_guide.py) installs it and runs its tests.
collect_ignore = ["example_plugin"]
