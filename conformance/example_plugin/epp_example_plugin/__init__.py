"""An out-of-tree plugin package for the inference EPP: a scorer and a filter."""
