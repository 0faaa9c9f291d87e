"""Navigation-style scenarios on Luna-1-format datasets."""
